"""One policy update from a TrainBatch: micro-batched forward/backward, clip, optimizer step."""

from __future__ import annotations

import torch

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.optim.batch import TrainBatch
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import ObjectiveConfig, policy_loss


def _micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def _logprobs_no_grad(model, batch: TrainBatch, size: int, temperature: float) -> torch.Tensor:
    """Log-probs [B, T-1] of the batch under ``model`` without gradient (old or reference policy)."""
    out = torch.zeros_like(batch.behavior_logprobs)
    for mb in _micro_batches(len(batch), size):
        sub = batch.select(mb)
        lp, _ = token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask, temperature, with_entropy=False)
        out[mb, : lp.shape[1]] = lp
    return out


def policy_update(
    model, optimizer, scheduler, batch: TrainBatch, objective: ObjectiveConfig, *, micro_batch_size: int,
    num_iterations: int, max_grad_norm: float, temperature: float, max_len: int, ref_model=None,
) -> dict[str, float]:
    """``num_iterations`` optimizer steps on ``batch``; returns averaged metrics."""
    device = next(model.parameters()).device
    batch = batch.to(device)
    # [B, T-1] over the whole batch; a sequence's length counts its untrained (shared, forced) tokens too
    weights = token_weights(batch.completion_mask, objective.loss_agg, max_len, lengths=batch.completion_lengths)
    # With one pass, the proximal ("old") policy is the current one: ratio 1, detached.
    old = _logprobs_no_grad(model, batch, micro_batch_size, temperature) if num_iterations > 1 else None
    ref = _logprobs_no_grad(ref_model, batch, micro_batch_size, temperature) if objective.needs_reference else None
    shaping: dict[str, float] = {}
    if "ace" in objective.shaping:
        batch.advantages, shaping = ace_shift(batch, ref)
    total_tokens = max(float(batch.completion_mask.sum()), 1.0)
    totals: dict[str, float] = {}
    model.train()
    for _ in range(num_iterations):
        optimizer.zero_grad(set_to_none=True)
        for mb in _micro_batches(len(batch), micro_batch_size):
            sub = batch.select(mb)
            width = sub.completion_mask.shape[1]
            policy_lp, entropy = token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask, temperature)
            old_lp = policy_lp.detach() if old is None else old[mb, :width]
            loss, m = policy_loss(
                policy_lp, old_lp, sub.advantages, sub.completion_mask, weights[mb, :width], objective,
                ref_logprobs=None if ref is None else ref[mb, :width], behavior_logprobs=sub.behavior_logprobs,
                entropy=entropy,
            )
            loss.backward()
            mask = sub.completion_mask
            share = float(mask.sum()) / total_tokens
            m["loss"] = loss.detach()
            m["entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
            with torch.no_grad():
                gap = ((policy_lp.detach() - sub.behavior_logprobs).abs() * mask).sum() / mask.sum().clamp(min=1)
            m["logprob_gap/behavior_vs_policy"] = gap
            for k, v in m.items():
                # loss adds up over micro-batches; per-token statistics average by token share
                totals[k] = totals.get(k, 0.0) + float(v) * (1.0 if k == "loss" else share) / num_iterations
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        scheduler.step()
        totals["grad_norm"] = totals.get("grad_norm", 0.0) + float(grad_norm) / num_iterations
    model.eval()
    totals["lr"] = scheduler.get_last_lr()[0]
    return totals | shaping


def ace_shift(batch: TrainBatch, ref: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """ACE ("Overconfident Errors Need Stronger Correction"): negative advantages × (1 + max(ĉ, 0)),
    ĉ = (log π(y|x) − log π_ref(y|x)) / |y| from the behaviour log-probs, detached."""
    from rollwise.optim.shaping import ace

    trained = (batch.completion_mask > 0).to(ref.dtype)
    logratio = ((batch.behavior_logprobs - ref) * trained).sum(-1)  # [B]
    lengths = trained.sum(-1).clamp(min=1)
    # every token of a flat rollout carries its sequence advantage; shape each token by its row's shift
    rows = batch.advantages.shape[1]
    shaped, metrics = ace(batch.advantages.reshape(-1), logratio.repeat_interleave(rows),
                          lengths.repeat_interleave(rows))
    return shaped.view_as(batch.advantages), {k: float(v) for k, v in metrics.items()}
