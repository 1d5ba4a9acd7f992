"""``old_logit_repair``: versioned old log-probs, so staleness and the engine gap are corrected apart.

"Missing Old Logits in Asynchronous Agentic RL" (2025): the off-policy ratio factors as
π_θ/μ = (π_θ/π_old^train)·(π_old^train/μ) — staleness (the policy moved since the version that
sampled) times the training–inference discrepancy (the engine's kernels/precision against the
trainer's forward of that same version). Without π_old^train, the decoupled-PPO objective takes its
ratio against the proximal policy π_prox (the weights before this update) and weights π_prox/μ: the
two factors are entangled, so the clip and the IS weight both see a mix of them.

The repair (METHODS.md's choice): every token carries the version that sampled it
(``Rollout.versions``); right after a batch is sampled — a batch is sampled entirely by one version,
so the "interrupt at sync" is the batch boundary — the trainer's forward of *that version's* weights
(the sampling policy: the async producer's copy, or the policy itself in a sync run) gives
``Rollout.old_logprobs`` = ℓ^old,train per token (``record_old_logprobs``). The update then PPO-clips
the first factor, r = π_θ/π_old^train, and sends the second, π_old^train/μ, through ``tis_mode``
(``tis_mis``; the preset uses ``token_truncate``, C = 2).

Guaranteed: a token whose version has no snapshot raises ``ValueError`` (never a silent fallback to
π_prox); in a synchronous run with one optimizer pass π_old^train = π_prox = π_θ, so the ratios and
weights are exactly those of the plain objective (tested).

Where we depart: the paper's approximate repair (PPO-EWMA, θ_prox ← .9·θ_prox + .1·θ) is not
implemented — the exact repair costs one no-grad forward per batch here, cheap at our sizes; only
the version that sampled a batch is kept (partial rollouts carried across versions, ``april``,
raise the missing-version error). With the in-process fp32 engine the discrepancy factor is tiny
(kernel noise); it matters with a bf16/GGUF engine or a remote one, and under staleness ≥ 1.
"""

from __future__ import annotations

import torch

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.types import RolloutGroup


@torch.no_grad()
def completion_logprobs(model, rollouts, sampling: dict, pad_token_id: int) -> list[list[float]]:
    """Teacher-forced log-probs of each rollout's completion tokens under ``model`` (one row each),
    on the distribution the engine sampled from (``sampling``: temperature, top_k, top_p)."""
    if not rollouts:
        return []
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    ids = torch.full((len(rollouts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rollouts):
        n = len(r.prompt_ids) + len(r.completion_ids)
        ids[i, :n], mask[i, :n] = torch.tensor(r.prompt_ids + r.completion_ids), 1
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    lp, _ = token_logprobs_and_entropy(model, ids.to(device), mask.to(device), with_entropy=False, **sampling)
    model.train(was_training)
    return [lp[i, len(r.prompt_ids) - 1 : len(r.prompt_ids) - 1 + len(r.completion_ids)].float().cpu().tolist()
            for i, r in enumerate(rollouts)]


def record_old_logprobs(groups: list[RolloutGroup], snapshots: dict[int, torch.nn.Module], sampling: dict,
                        pad_token_id: int) -> dict[str, float]:
    """Set ``Rollout.old_logprobs`` (and its segments') from the snapshot of the version that sampled
    each token; raises ``ValueError`` naming the version when a token's version has no snapshot."""
    rollouts = [x for g in groups for r in g.rollouts for x in (r, *(r.segments or ()))]
    for r in rollouts:
        missing = sorted(set(r.versions) - set(snapshots))
        if missing:
            raise ValueError(f"old_logit_repair: rollout of prompt {r.prompt_id} has tokens of policy version(s) "
                             f"{missing}, and only {sorted(snapshots)} are kept: the trainer's old log-probs of "
                             "those tokens are missing")
        r.old_logprobs = [0.0] * len(r.completion_ids)
    gap, count = 0.0, 0
    for version, model in snapshots.items():
        mine = [r for r in rollouts if version in r.versions]
        for r, lp in zip(mine, completion_logprobs(model, mine, sampling, pad_token_id)):
            for t, v in enumerate(r.versions):
                if v == version:
                    r.old_logprobs[t] = lp[t]
                    gap += abs(lp[t] - r.behavior_logprobs[t])
                    count += 1
    return {"old_logits/abs_gap_to_behavior": gap / max(count, 1)}
