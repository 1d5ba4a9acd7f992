"""``concise_r``: ConciseR's second stage, L-GRPO's length term (filter-stage shaping).

ConciseR, "Walk Before You Run! Concise LLM Reasoning via Reinforcement Learning" (Song &
Zheng, 2025): stage 1 runs GRPO++ (GRPO with clip-higher and dynamic sampling); stage 2 runs
L-GRPO, which rewards shortness only in groups whose rollouts are *all* correct, so length is
optimised once the prompt is solved and never at the expense of accuracy.

The rule (METHODS.md's choice): from the stage-2 step on, a group whose rollouts are all correct
gets r = 1 + w·(1 − |y|/L_max) per rollout (w = .5, L_max = ``rollout.max_new_tokens``,
|y| the rollout's sampled tokens); a group with any wrong (or failed) rollout is left as it is.
It runs in the filter stage, after the rewards and before ``control.accept``: an all-correct
group has no reward spread under plain GRPO and dynamic sampling would drop it; with the term it
carries the length signal.

Guaranteed: the term is ≥ 0, added once per rollout (``reward_components["concise_r"]``); before
step ``concise_r_start`` nothing changes, so stage 1 is exactly GRPO++ (the ``concise_r`` preset:
clip-higher, ``token_mean``, ``control.method=dynamic_sampling``).

Where we depart: the term is *added* to the rollout's reward (r + w·(1 − |y|/L_max)) rather than
setting r to 1 + …: with a binary verifier these agree; with graded rewards the verifier's score
is kept. The paper switches stages by hand once stage 1 has converged; here stage 2 starts at step
``objective.concise_r_start``, 0 by default (the all-correct gate alone keeps the length term from
costing accuracy, and a short run shows the term): set it to the step stage 1 should end at for the
paper's schedule. The length effect needs longer completions than the tiny arith model writes (a
bigger model).
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.types import RolloutGroup


def length_terms(correct: Sequence[bool], lengths: Sequence[int], max_len: int, weight: float = 0.5) -> list[float]:
    """One group's length terms: w·(1 − |y|/L_max) per rollout when every rollout is correct, else 0s.

    >>> length_terms([True, True], [10, 30], 40), length_terms([True, False], [10, 30], 40)
    ([0.375, 0.125], [0.0, 0.0])
    """
    if max_len < 1:
        raise ValueError(f"concise_r: L_max must be >= 1, got {max_len}")
    if not correct or not all(correct):
        return [0.0] * len(correct)
    return [weight * (1 - min(n, max_len) / max_len) for n in lengths]


def add_length_terms(groups: list[RolloutGroup], max_len: int, weight: float = 0.5) -> dict[str, float]:
    """Add each all-correct group's length terms to its rollouts' rewards; the share of groups shaped."""
    shaped = 0
    for g in groups:
        rollouts = g.rollouts
        terms = length_terms([r.failure is None and r.correct for r in rollouts],
                             [r.num_tokens for r in rollouts], max_len, weight)
        if rollouts and all(r.failure is None and r.correct for r in rollouts):
            shaped += 1
        for r, term in zip(rollouts, terms):
            r.reward += term
            r.reward_components["concise_r"] = term
    return {"concise_r/shaped_groups": shaped / max(len(groups), 1)}
