"""``dagrpo``: distinctiveness-aware group advantages (DaGRPO, "Distinctiveness-Aware GRPO", 2025).

GRPO's advantage is a sum of pairwise comparisons: r_i − mean(r) = (1/G)·Σ_j (r_i − r_j). When two
responses are nearly the same text but one is rewarded and the other not, their comparison pushes
the shared tokens up and down at once — a gradient conflict that carries no information about
which tokens made the difference. DaGRPO drops those pairs:

    A_i = (1/G) · Σ_{j ∈ M_i} (r_i − r_j) / std,   M_i = { j : Jaccard_n(y_i, y_j) ≤ τ },

with the n-gram Jaccard similarity of the completions' token ids (``rollwise.types.jaccard``, the
one LATR prunes with), n = 4 and τ = .8 (``objective.dagrpo_ngram``, ``dagrpo_similarity``) and
std the group's reward std (``scale_rewards``, Bessel, + 1e-6). With no pair masked this is exactly
GRPO; a group without reward spread gets 0, as every estimator gives it.

    >>> import torch
    >>> a = dagrpo_advantages(torch.tensor([1., 0, 0]), torch.zeros(3, dtype=torch.long),
    ...                       [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])
    >>> [round(float(x), 3) for x in a]
    [0.577, 0.0, -0.577]

The paper's second half — a high-quality off-policy anchor (a reference answer, r = 1, ratio fixed
at 1) injected into groups with at most one positive — is a Generate-stage step
(``generate/anchor.py``, ``rollout.anchors``), which ``objective.method: dagrpo`` turns on.

Where we depart: the divisor is the whole group's std, not the std over the unmasked pairs; anchors
are the task's reference solution, not a stronger model's answers.
"""

from __future__ import annotations

import torch

from rollwise.optim.advantages import ScaleRewards, no_spread, reward_scale
from rollwise.types import jaccard


def distinct_pairs(completions: list[list[int]], ngram: int = 4, similarity: float = 0.8) -> list[list[bool]]:
    """[G][G]: whether completions i and j are distinct enough to compare (Jaccard ≤ ``similarity``)."""
    n = len(completions)
    keep = [[True] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            keep[i][j] = keep[j][i] = jaccard(completions[i], completions[j], ngram) <= similarity
    return keep


def dagrpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, completions: list[list[int]],
                      scale_rewards: ScaleRewards = "group", ngram: int = 4, similarity: float = 0.8) -> torch.Tensor:
    """Advantages [N] (float64) of rewards [N] in groups ``group_ids`` [N], ``completions[k]`` the
    token ids of sample k: pairwise differences to the samples distinct from it, over G, scaled."""
    r = rewards.double()
    adv = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        index = (group_ids == g).nonzero().squeeze(-1).tolist()
        keep = distinct_pairs([completions[k] for k in index], ngram, similarity)
        for a, i in enumerate(index):
            total = sum(float(r[i] - r[j]) for b, j in enumerate(index) if keep[a][b])
            adv[i] = total / len(index)
    adv = adv / reward_scale(r, group_ids, scale_rewards)
    return adv.masked_fill(no_spread(r, group_ids), 0.0)
