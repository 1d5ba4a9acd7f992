"""Group-relative advantage estimators: pure functions of reward tensors.

- ``grpo``: A = (r − mean_group) / (std + 1e-6) — DeepSeekMath, "Pushing the Limits of
  Mathematical Reasoning in Open Language Models" (Shao et al., 2024).
- ``dr_grpo``: the same centring, with ``scale_rewards`` choosing the divisor: ``group``
  (GRPO), ``batch`` (one std over the whole batch) or ``none`` (mean-centring only) —
  "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025).

std is Bessel-corrected (METHODS.md conventions); a group of one has std 0 and advantage 0.
"""

from __future__ import annotations

from typing import Literal

import torch

ScaleRewards = Literal["group", "batch", "none"]
EPS = 1e-6


def group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and Bessel-corrected std of its group. rewards, group_ids: [N]."""
    groups, inverse = torch.unique(group_ids, return_inverse=True)
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    zeros = torch.zeros(len(groups), dtype=rewards.dtype, device=rewards.device)
    count = zeros.index_add(0, inverse, torch.ones_like(rewards))
    mean = (zeros.index_add(0, inverse, rewards) / count)[inverse]
    sq = zeros.index_add(0, inverse, (rewards - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[inverse]


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards = "group"):
    """Advantages [N] for rewards [N] whose group membership is group_ids [N].

    >>> group_advantages(torch.tensor([1., 0, 0, 0]), torch.zeros(4, dtype=torch.long))
    tensor([ 1.5000, -0.5000, -0.5000, -0.5000])
    """
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    mean, std = group_stats(rewards, group_ids)
    centred = rewards - mean
    if scale_rewards == "group":
        return centred / (std + EPS)
    if scale_rewards == "batch":
        return centred / (rewards.std() + EPS) if rewards.numel() > 1 else torch.zeros_like(rewards)
    if scale_rewards == "none":
        return centred
    raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
