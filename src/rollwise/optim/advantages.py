"""Group-relative advantage estimators: pure functions of reward tensors.

- ``grpo``: A = (r − mean_group) / (std + 1e-6) — DeepSeekMath, "Pushing the Limits of
  Mathematical Reasoning in Open Language Models" (Shao et al., 2024).
- ``dr_grpo``: the same centring, with ``scale_rewards`` choosing the divisor: ``group``
  (GRPO), ``batch`` (one std over the whole batch) or ``none`` (mean-centring only) —
  "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025).

- ``tree_adv``: advantages for tree rollouts (TreePO, "TreePO: Bridging the Gap of Policy
  Optimization and Efficacy and Inference Efficiency with Heuristic Tree-based Modeling",
  2025; the blend as in PORTool and TreePS-RAG): a node's value V(n) is the mean
  reward of the leaves below it; the trajectory (global) term is V(n) − V(root), the fork
  (local) term V(n) − V(parent); A(n) = (1 − mix)·global + mix·local, ``mix`` = 0.5 by
  default. A leaf's global term is r − mean(leaves), GRPO's centring. Our departure: the
  same ``scale_rewards`` divisor as flat groups (group std of the leaf rewards, batch std,
  or none) so tree and group runs share a learning rate.

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
    mean, _ = group_stats(rewards, group_ids)
    return (rewards - mean) / reward_scale(rewards, group_ids, scale_rewards)


def reward_scale(rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: ScaleRewards) -> torch.Tensor:
    """The divisor [N] of each sample's centred reward: group std + eps, batch std + eps, or 1."""
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    if scale_rewards == "group":
        return group_stats(rewards, group_ids)[1] + EPS
    if scale_rewards == "batch":
        # one sample has no spread: an infinite divisor gives it advantage 0
        std = rewards.std() if rewards.numel() > 1 else torch.tensor(float("inf"))
        return torch.full_like(rewards, float(std) + EPS)
    if scale_rewards == "none":
        return torch.ones_like(rewards)
    raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")


def tree_node_advantages(parents: dict[int, int | None], leaf_nodes: list[int], rewards: list[float],
                         mix: float = 0.5) -> dict[int, float]:
    """Unscaled ``tree_adv`` advantage of every node that has a leaf below it (the root gets none).

    ``parents`` maps node id → parent id (None for the root); ``leaf_nodes[i]`` is the leaf
    node of the rollout with reward ``rewards[i]``.

    >>> parents = {0: None, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
    >>> adv = tree_node_advantages(parents, [3, 4, 5, 6], [1, 1, 0, 1])
    >>> [adv[n] for n in (1, 2, 5, 6)]
    [0.25, -0.25, -0.625, 0.375]
    """
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for leaf, r in zip(leaf_nodes, rewards):
        node = leaf
        while node is not None:
            total[node] = total.get(node, 0.0) + float(r)
            count[node] = count.get(node, 0) + 1
            node = parents[node]
    value = {n: total[n] / count[n] for n in total}
    root = next(n for n, p in parents.items() if p is None)
    return {n: (1 - mix) * (v - value[root]) + mix * (v - value[parents[n]])
            for n, v in value.items() if n != root}
