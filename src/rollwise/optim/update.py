"""One policy update from a TrainBatch: micro-batched forward/backward, clip, optimizer step.

``policy_update(model, optimizer, batch, spec)``: ``spec`` (an ``UpdateSpec``) says what the
update does — the objective, the optimizer passes, the micro-batching, the sampling settings
the log-probs are computed under, and the forward.

Rows that carry no signal are not run: a rollout whose trained tokens all have advantage
exactly 0 contributes exactly zero loss and zero gradient to every policy loss here (each is
a multiple of the advantage), so when no term without an advantage is active (a KL term,
``beta > 0``; the batch-level entropy quantile, ``top_entropy_quantile < 1``) its forward and
backward are skipped (``optim.skip_zero_advantage``). The loss weights are computed on the
whole batch first, so the loss, the gradient and the optimizer step are those of the full
batch; ``update/skipped_rows`` logs the share saved.

Llama-family models run the forward packed (``rollwise.model.packed``, ``optim.forward``):
no padding, the engine's own arithmetic, the LM head only on completion tokens, and the
rows of a micro-batch that repeat one prompt (a GRPO group) computing it once
(``optim.share_prompts``; ``update/prompt_tokens_shared`` logs the prompt tokens spared per
pass); other models run the HF module on the padded micro-batch. All give the same log-probs
and gradients (``tests/test_packed.py``, ``tests/test_packed_shared.py``, ``tests/test_optim.py``).

The compute dtype (``spec.compute_dtype``, ``optim.compute_dtype``): below the weights' own dtype
(bfloat16 on fp32 weights) every forward of the update — the policy's, the old policy's, the
reference's — runs under ``torch.autocast``: the matmuls (and their backward, which follows the
forward's dtypes) in bf16; the weights, their gradients and the optimizer state stay fp32 (the
master weights). The logits are upcast before the log-softmax over the vocabulary
(``rollwise.model.logprobs._scored``), so log-probs, entropies, ratios, advantages and the loss
are fp32 arithmetic; the loss and the backward call run outside autocast.

A pass whose loss or gradient norm is not finite (NaN, ±inf) is skipped: no optimizer step
(weights, moments and step count untouched), its gradient dropped, its metrics left out, and
``update/skipped_nonfinite`` counts it — a non-finite number never reaches the weights.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from rollwise.model.logprobs import logits_chunk, token_logprobs_and_entropy
from rollwise.model.packed import PackedForward
from rollwise.model.reference import as_reference
from rollwise.optim.batch import TrainBatch
from rollwise.optim.correction import mismatch_metrics
from rollwise.optim.losses import token_weights
from rollwise.optim.config import ObjectiveConfig
from rollwise.optim.objective import policy_loss


@dataclass(frozen=True)
class UpdateSpec:
    """What one policy update does: the objective, how many optimizer passes, how the forward runs.

    The trainer builds one per step from ``objective.*``, ``optim.*`` and ``rollout.*``
    (``Trainer.update_spec``); tests and benchmarks build their own.
    """

    objective: ObjectiveConfig
    # optimizer steps over the batch: the most any source asks — optim.num_iterations (TRL's
    # name), a controller's update_passes (DARS-B's breadth), a replay method's (ReMix's UTD)
    passes: int = 1
    max_len: int = 128  # rollout.max_new_tokens: the fixed length some loss_agg modes divide by
    micro_batch_size: int = 64  # rows per forward/backward (gradient accumulation)
    max_grad_norm: float = 1.0
    # the sampling settings: trainer log-probs are computed on the distribution the engine sampled from
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    skip_zero_advantage: bool = True  # rows without signal skip their forward/backward (module docstring)
    logits_budget_mb: float | None = None  # cap on the float32 logits a forward holds at once (chunked LM head)
    packed: bool = False  # the packed forward (Llama-family models: ``supports_packing``)
    share_prompts: bool = True  # packed: a prompt repeated by rows of a micro-batch computed once (same numbers)
    compute_dtype: torch.dtype = torch.float32  # the forwards' matmuls: below the weights' dtype, autocast (docstring)

    @property
    def sampling(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @property
    def skips_rows(self) -> bool:
        """Whether rows without signal may skip their forward: no term of the loss lives without an advantage."""
        o = self.objective
        return self.skip_zero_advantage and o.beta == 0 and o.prox_kl_coef == 0 and o.top_entropy_quantile >= 1


def policy_update(model, optimizer, batch: TrainBatch, spec: UpdateSpec, ref_model=None) -> dict[str, float]:
    """``spec.passes`` optimizer steps on ``batch``; returns metrics averaged over the passes.

    The LR schedule is the caller's: it advances once per training step, not per pass.
    ``ref_model`` is the KL reference: a frozen module or a ``rollwise.model.reference.Reference``.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    # [B, T-1] over the whole batch, the per-token loss weights (k for a tree node shared by k leaves)
    # counted as k tokens, as k flat rollouts would be; a sequence's length is its sampled tokens (a tree
    # leaf's shared prefix included, an episode's inserted ids not), an episode of several rows one sequence
    trained = batch.trained_mask
    weights = token_weights(batch.loss_weights, spec.objective.loss_agg, spec.max_len,
                            lengths=batch.normaliser_lengths, num_sequences=batch.num_sequences)
    ref_full, shaping = None, {}
    if spec.objective.needs_reference:  # a frozen copy, or (LoRA) the policy with its adapters off
        with as_reference(ref_model).module() as reference:
            ref_full = _logprobs_no_grad(reference, batch, spec)
        if "ace" in spec.objective.shaping:
            batch.advantages, shaping = ace_shift(batch, ref_full)
    n_rows = len(batch)
    keep = rows_with_signal(batch) if spec.skips_rows else torch.ones(n_rows, dtype=torch.bool, device=device)
    rows = keep.nonzero().squeeze(-1)
    work = batch.select(rows) if len(rows) else None
    weights = weights[rows]
    ref = ref_full[rows] if ref_full is not None else None
    # With one pass, the proximal ("old") policy is the current one: ratio 1, detached.
    old = _logprobs_no_grad(model, work, spec) if spec.passes > 1 and work is not None else None
    total_tokens = max(float(trained[rows].sum()), 1.0)
    forward = PackedForward(model) if spec.packed else None
    totals: dict[str, float] = {}
    model.train()
    skipped = 0  # passes whose loss or gradient norm was not finite: no optimizer step
    for _ in range(spec.passes):
        optimizer.zero_grad(set_to_none=True)
        micro = _micro_batches(len(rows), spec.micro_batch_size) if work is not None else []
        metrics = {}
        for mb in micro:
            m = _backward(model, forward, work.select(mb), weights[mb], old, ref, mb, spec)
            share = m.pop("tokens") / total_tokens
            for k, v in m.items():
                # loss adds up over micro-batches; per-token statistics average by token share
                metrics[k] = metrics.get(k, 0.0) + float(v) * (1.0 if k == "loss" else share) / spec.passes
        grad_norm = _step(model, optimizer, metrics.get("loss", 0.0), spec.max_grad_norm)
        if grad_norm is None:
            skipped += 1
            continue
        metrics["grad_norm"] = grad_norm / spec.passes
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v
    model.eval()
    totals.setdefault("loss", 0.0)
    totals.setdefault("grad_norm", 0.0)
    totals["update/skipped_nonfinite"] = float(skipped)
    totals["update/skipped_rows"] = 1.0 - len(rows) / max(n_rows, 1)
    totals["update/trained_tokens"] = float(trained[rows].sum())
    # prompt tokens the training forward did not compute again, per pass over the batch
    totals["update/prompt_tokens_shared"] = forward.prompt_tokens_shared / spec.passes if forward is not None else 0.0
    return totals | shaping


def _step(model, optimizer, loss: float, max_grad_norm: float) -> float | None:
    """Clip the accumulated gradient and step; returns its norm, or None when the loss or the norm
    is not finite: then no step is taken (weights, the optimizer's moments and step count
    untouched) and the gradient is dropped — a non-finite number never reaches the weights."""
    for p in model.parameters():  # a batch without signal still takes its (zero-gradient) optimizer step
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    if not (math.isfinite(grad_norm) and math.isfinite(loss)):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return grad_norm


def _backward(model, forward: PackedForward | None, sub: TrainBatch, weights: torch.Tensor, old: torch.Tensor | None,
              ref: torch.Tensor | None, mb: slice, spec: UpdateSpec) -> dict:
    """The loss of one micro-batch, backpropagated; its metrics (tensors) and trained token count."""
    width = sub.completion_mask.shape[1]
    mask = sub.trained_mask
    policy_lp, entropy = _logprobs(model, forward, sub, spec)
    old_lp = policy_lp.detach() if old is None else old[mb, :width]
    if sub.old_logprobs is not None:  # old_logit_repair: the ratio against the version that sampled (old_logits.py)
        old_lp = sub.old_logprobs
    loss, m = policy_loss(
        policy_lp, old_lp, sub.advantages, mask, weights[:, :width], spec.objective,
        ref_logprobs=None if ref is None else ref[mb, :width], behavior_logprobs=sub.behavior_logprobs,
        entropy=entropy,
    )
    loss.backward()
    m["loss"] = loss.detach()
    m["entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
    with torch.no_grad():
        gap = ((policy_lp.detach() - sub.behavior_logprobs).abs() * mask).sum() / mask.sum().clamp(min=1)
    m["logprob_gap/behavior_vs_policy"] = gap
    # the behaviour/trainer mismatch against the proximal policy the IS weight uses (optim/correction.py);
    # averaged over micro-batches by token share like the statistics above (the ESS so only approximately)
    m |= mismatch_metrics(old_lp.detach(), sub.behavior_logprobs, mask)
    m.setdefault("mismatch/truncated_frac", torch.zeros(()))  # tis_mode none: nothing truncated
    m["tokens"] = float(mask.sum())
    return m


def _micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _logprobs(model, packed: PackedForward | None, sub: TrainBatch, spec: UpdateSpec,
              with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) ``[b, t-1]`` of a micro-batch's completion tokens under ``model``:
    packed when ``packed`` is given, else the HF module on the padded rows."""
    with compute(model, spec.compute_dtype):  # the log-probs come out fp32 either way (_scored upcasts)
        if packed is not None:
            scored = sub.completion_mask
            chunk = logits_chunk(model, 1, int(scored.sum()) + 1, spec.logits_budget_mb)  # the head: scored positions
            return packed.logprobs(sub.input_ids, sub.attention_mask, scored, chunk=chunk, with_entropy=with_entropy,
                                   share_prompts=spec.share_prompts, **spec.sampling)
        chunk = logits_chunk(model, *sub.input_ids.shape, spec.logits_budget_mb)
        return token_logprobs_and_entropy(model, sub.input_ids, sub.attention_mask, with_entropy=with_entropy,
                                          chunk=chunk, **spec.sampling)


def compute(model, dtype: torch.dtype) -> AbstractContextManager:
    """A forward of ``model`` in ``dtype``: ``torch.autocast`` where ``dtype`` is narrower than the
    weights' own (fp32 weights, bf16 compute), else nothing — a model loaded in bf16 runs as it is."""
    weight = next(model.parameters())
    if dtype.itemsize >= weight.dtype.itemsize:
        return nullcontext()
    return torch.autocast(weight.device.type, dtype=dtype)


@torch.no_grad()
def _logprobs_no_grad(model, batch: TrainBatch, spec: UpdateSpec) -> torch.Tensor:
    """Log-probs [B, T-1] of the batch under ``model`` without gradient (old or reference policy)."""
    out = torch.zeros_like(batch.behavior_logprobs)
    forward = PackedForward(model) if spec.packed else None
    for mb in _micro_batches(len(batch), spec.micro_batch_size):
        lp, _ = _logprobs(model, forward, batch.select(mb), spec, with_entropy=False)
        out[mb, : lp.shape[1]] = lp
    return out


def rows_with_signal(batch: TrainBatch) -> torch.Tensor:
    """[B] bool: the row has a trained token with a non-zero advantage. Exact zero, so skipping the
    other rows changes nothing; a group with no signal (``rollwise.types.is_zero_signal``, the one
    definition dynamic sampling uses too) gets advantage exactly 0 from every estimator."""
    return ((batch.advantages != 0) & (batch.loss_weights > 0)).any(-1)


def ace_shift(batch: TrainBatch, ref: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """ACE ("Overconfident Errors Need Stronger Correction"): negative advantages × (1 + max(ĉ, 0)),
    ĉ = (log π(y|x) − log π_ref(y|x)) / |y| from the behaviour log-probs, detached."""
    from rollwise.optim.shaping import ace

    trained = batch.trained_mask.to(ref.dtype)
    logratio = ((batch.behavior_logprobs - ref) * trained).sum(-1)  # [B]
    lengths = trained.sum(-1).clamp(min=1)
    # every token of a flat rollout carries its sequence advantage; shape each token by its row's shift
    rows = batch.advantages.shape[1]
    shaped, metrics = ace(batch.advantages.reshape(-1), logratio.repeat_interleave(rows),
                          lengths.repeat_interleave(rows))
    return shaped.view_as(batch.advantages), {k: float(v) for k, v in metrics.items()}
