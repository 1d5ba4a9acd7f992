"""``high_entropy_steps``' step half: train only the highest-entropy steps — DART ("Efficient
Multi-turn RL for GUI Agents via Decoupled Training and Adaptive Data Curation", 2025), whose
GUI agent trains on its high-entropy steps; the token half is TRL's ``top_entropy_quantile``
(``optim.losses.entropy_mask``, Beyond the 80/20 Rule).

``objective.top_entropy_step_quantile: q`` (< 1; METHODS.md: q = .5 for steps): a step is one
turn of an episode (``Rollout.turns``), a rollout without turns is one step; its entropy is the
mean −log μ(y_t) over its sampled tokens; over the batch's steps, those at or above the (1 − q)
quantile keep their loss weights and the others get weight 0 (10 distinct step entropies with
q = .2 keep exactly 2). Tokens outside every turn (tool results, inserted ids) are left as they
were. The rollouts given are not changed: the batch trains copies (replay keeps the originals).

Where we depart: DART's step entropy is the policy's entropy over its action distribution; we
estimate it from the sampled tokens' behaviour log-probs (the engine returns no full
distribution), and the quantile is per training batch, not per task. Needs a bigger model and a
GUI/tool environment with long episodes to show DART's effect.
"""

from __future__ import annotations

import dataclasses

import torch

from rollwise.types import Rollout, RolloutGroup


def step_entropies(rollout: Rollout) -> list[tuple[int, int, float]]:
    """(start, end, mean −log μ) per step of ``rollout``: its turns, else its whole completion."""
    spans = [(t.start, t.end) for t in rollout.turns] if rollout.turns else [(0, len(rollout.completion_ids))]
    lps = rollout.behavior_logprobs
    return [(a, b, -sum(lps[a:b]) / (b - a)) for a, b in spans if b > a]


def _rows(groups: list[RolloutGroup]) -> list[Rollout]:
    return [x for g in groups for r in g.rollouts for x in (r, *(r.segments or ()))]


def _masked(r: Rollout, threshold: float) -> Rollout:
    weights = list(r.loss_weights) if r.loss_weights is not None else [1.0] * len(r.completion_ids)
    for a, b, h in step_entropies(r):
        if h < threshold:
            weights[a:b] = [0.0] * (b - a)
    segments = [_masked(s, threshold) for s in r.segments] if r.segments else r.segments
    return dataclasses.replace(r, loss_weights=weights, segments=segments)


def keep_high_entropy_steps(groups: list[RolloutGroup], quantile: float) -> tuple[list[RolloutGroup], dict]:
    """Copies of ``groups`` whose steps below the batch's (1 − ``quantile``) step-entropy quantile have
    loss weight 0, and the share of steps kept (``entropy_steps/kept``)."""
    entropies = [h for r in _rows(groups) for _, _, h in step_entropies(r)]
    if quantile >= 1 or not entropies:
        return groups, {}
    threshold = float(torch.quantile(torch.tensor(entropies, dtype=torch.float64), 1 - quantile))
    out = [dataclasses.replace(g, rollouts=[_masked(r, threshold) for r in g.rollouts]) for g in groups]
    return out, {"entropy_steps/kept": sum(h >= threshold for h in entropies) / len(entropies)}
