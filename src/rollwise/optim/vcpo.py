"""``vcpo``: variance control for off-policy (async, replay) batches by their effective sample size.

VCPO, "Stable Asynchrony: Variance-Controlled Off-Policy RL for LLMs" (2025): stale data makes the
sequence importance weights heavy-tailed, and the collapsing effective sample size (ESS) predicts
the gradient's variance. VCPO scales the learning rate by the ESS and uses the closed-form
minimum-variance baseline.

The rule (METHODS.md's choice), over a step's N sampled rollouts:

- w_i = exp(Σ_t (ℓ^θ − ℓ^μ)) over rollout i's sampled tokens, the log clamped to [−5, 5]
  (ℓ^θ: the policy about to be updated, a no-grad forward; ℓ^μ: the engine's behaviour log-probs);
- ESS = (Σw)²/Σw² and this step's lr = lr_0·ESS/N (``scaled_lr``; the schedule's lr comes back after
  the update). ESS/N is ``mismatch_metrics``' normalised ESS (``optim/correction.py``) of the clamped
  sequence weights, logged every step as ``vcpo/ess`` (with ``vcpo/lr_scale`` = ESS/N);
- A_i = r_i − b*, b* = Σ_g w²r/Σ_g w² over the rollout's group g (``Rollout.value_baseline``;
  ``objective.advantage=vcpo``, no std scaling).

Guaranteed: on-policy (ℓ^θ = ℓ^μ) every w = 1, so ESS = N, the lr is unchanged and b* is the group
mean (A = r − mean, Dr. GRPO's advantage); the lr is never raised (ESS ≤ N).

Where we depart: ESS and b* are computed over the step's freshly sampled groups, not the groups a
replay method adds (their weights are those of their own step). The per-group b* applies the
paper's batch formula within each prompt's group, as GRPO's baseline is per group. An in-process
sync run is on-policy up to kernel noise, so the lr scale is ≈ 1: its effect needs staleness
(``train.mode=async`` with a bigger ``max_staleness``, where the paper's gains are measured on a
long-horizon tool-use task with a bigger model and GPUs).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from rollwise.optim.correction import mismatch_metrics
from rollwise.optim.old_logits import completion_logprobs
from rollwise.types import RolloutGroup


def sequence_weights(log_ratio: torch.Tensor, clamp: float = 5.0) -> torch.Tensor:
    """w = exp(clamp(Σ_t(ℓ^θ − ℓ^μ), −c, c)) from the per-sequence log-ratio sums [N].

    >>> sequence_weights(torch.tensor([0.0, 7.0, -7.0])).log().tolist()
    [0.0, 5.0, -5.0]
    """
    return torch.exp(log_ratio.double().clamp(-clamp, clamp))


def normalised_ess(w: torch.Tensor) -> float:
    """ESS/N = (Σw)²/(N·Σw²), through ``mismatch_metrics`` on the sequence weights.

    >>> round(normalised_ess(torch.tensor([1.0, 1.0, 2.0])) * 3, 3)
    2.667
    """
    log_w = w.double().log().unsqueeze(-1)  # [N, 1]: one "token" per sequence
    ones = torch.ones_like(log_w)
    return float(mismatch_metrics(log_w, torch.zeros_like(log_w), ones)["mismatch/ess"])


def min_variance_baselines(w: torch.Tensor, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """b* = Σw²r/Σw² within each group, per rollout [N].

    >>> min_variance_baselines(torch.tensor([1.0, 1, 2]), torch.tensor([0.0, 1, 1]), torch.zeros(3, dtype=torch.long))
    tensor([0.8333, 0.8333, 0.8333], dtype=torch.float64)
    """
    w2 = w.double() ** 2
    num = torch.zeros(int(group_ids.max()) + 1, dtype=torch.float64).index_add_(0, group_ids, w2 * rewards.double())
    den = torch.zeros_like(num).index_add_(0, group_ids, w2)
    return (num / den)[group_ids]


@torch.no_grad()
def policy_log_ratios(model, groups: list[RolloutGroup], sampling: dict, pad_token_id: int) -> torch.Tensor:
    """Σ_t (ℓ^θ − ℓ^μ) per rollout of ``groups`` [N], ℓ^θ from a no-grad forward of ``model`` under the
    sampling settings (temperature, top-k/p) the engine sampled with, one rollout per row."""
    rollouts = [r for g in groups for r in g.rollouts]
    if any(r.segments for r in rollouts):
        raise ValueError("objective.vcpo: harness episodes of several segments are not supported")
    out = []
    for r, lp in zip(rollouts, completion_logprobs(model, rollouts, sampling, pad_token_id)):
        policy = torch.tensor(lp, dtype=torch.float64)
        trained = torch.tensor([1.0] * len(lp) if r.loss_weights is None else [float(x > 0) for x in r.loss_weights],
                               dtype=torch.float64)
        out.append(float(((policy - torch.tensor(r.behavior_logprobs, dtype=torch.float64)) * trained).sum()))
    return torch.tensor(out, dtype=torch.float64)


def assign_vcpo(groups: list[RolloutGroup], log_ratio: torch.Tensor, clamp: float = 5.0
                ) -> tuple[float, dict[str, float]]:
    """Set each rollout's ``value_baseline`` to its group's b*; return (the lr scale ESS/N, metrics)."""
    rollouts = [r for g in groups for r in g.rollouts]
    w = sequence_weights(log_ratio, clamp)
    group_ids = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.rollouts])
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)
    for r, b in zip(rollouts, min_variance_baselines(w, rewards, group_ids).tolist()):
        r.value_baseline = b
    scale = normalised_ess(w)
    return scale, {"vcpo/ess": scale * len(rollouts), "vcpo/lr_scale": scale,
                   "vcpo/max_weight": float(w.max()), "vcpo/clamped": float((log_ratio.abs() > clamp).double().mean())}


@contextmanager
def scaled_lr(optimizer, scale: float):
    """The optimizer's lr × ``scale`` inside the block (this step's update), restored after it."""
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * scale
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
