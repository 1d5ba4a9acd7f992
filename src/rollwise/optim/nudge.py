"""``nudge``'s advantage: inter- and intra-context terms plus a distillation term (NudgeRL,
"Strategy-Guided Exploration for RLVR", 2025; the rollouts come from ``generate/nudge.py``).

A prompt's group is split over K strategy contexts c_k (G/K rollouts each, sampled under x⊕c_k,
trained on x). With r̄_k the mean reward under context k and r̄ the group's mean:

    A_{k,i} = (r_{k,i} − r̄_k) + λ_inter·(r̄_k − r̄) + λ_distill·1[y_{k,i} correct, c_k non-empty]

λ_inter = .5 (``objective.nudge_inter``): a rollout is compared with its own context's siblings in
full and its context with the others at half weight. The last term is the distillation: the NLL of
a successful conditioned response under the bare prompt, weight λ_distill = .1
(``objective.nudge_distill``) — −λ·log π_θ(y|x) has the gradient of +λ on that rollout's advantage
at ratio 1, so it enters as that, with the IS weight min(π_θ(y|x)/π_old(y|x⊕c), 2) as ``guide``'s.
K = 1 with an empty context is GRPO without the std (``scale_rewards: none``).

    >>> import torch
    >>> a = nudge_advantages(torch.tensor([1., 0, 1, 1]), torch.zeros(4, dtype=torch.long),
    ...                      torch.tensor([0, 0, 1, 1]), torch.tensor([True, False, True, True]))
    >>> [round(float(x), 3) for x in a]
    [0.475, -0.625, 0.225, 0.225]

Where we depart: a group without reward spread gets 0 (no distillation either), as every estimator
here gives it — the update then skips its rows; the paper's distillation is a separate loss term,
here a shift of the advantage (the same gradient at the first pass, clipped with the surrogate after).
"""

from __future__ import annotations

import torch

from rollwise.optim.advantages import no_spread


def nudge_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, context_ids: torch.Tensor,
                     distill: torch.Tensor, inter: float = 0.5, distill_weight: float = 0.1) -> torch.Tensor:
    """Advantages [N] (float64): ``context_ids`` [N] names each sample's (group, context) cell, ``distill``
    [N] bool marks the successful conditioned responses."""
    r = rewards.double()
    group_mean = _means(r, group_ids)
    context_mean = _means(r, context_ids)
    adv = (r - context_mean) + inter * (context_mean - group_mean) + distill_weight * distill.double()
    return adv.masked_fill(no_spread(r, group_ids), 0.0)


def _means(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[N]: the mean of ``values`` over the samples that share each sample's id."""
    _, inverse = torch.unique(ids, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=values.dtype).index_add_(0, inverse, values)
    counts = torch.zeros_like(sums).index_add_(0, inverse, torch.ones_like(values))
    return (sums / counts)[inverse]
