"""``support_diag``: support and entropy diagnostics on the eval (probe) set — The Invisible Leash
(Wu et al., 2025, "The Invisible Leash: Why RLVR May Not Escape Its Origin").

RLVR is bounded by the base model's support; these say whether a run narrows it. With
``train.eval_samples: n`` (> 0) every eval (each ``train.eval_every`` steps, the probe set = the eval
split) logs, from its n sampled completions per prompt:

- ``eval/pass@k`` at k = 1 and k = n (``rollwise.eval.passk``, unbiased, any n — k ≤ 256 in the paper);
- ``eval/support_shrinkage``: the share of probe prompts the base model solved (some sample correct at
  the run's first eval) that the current model no longer solves; ``eval/support_expansion`` the reverse;
- ``eval/answer_entropy``: the entropy (nats) of the extracted answers within a prompt's n samples,
  averaged over prompts (answers [3, 3, 5, 7] → 1.0397);
- ``eval/token_entropy``: the mean of −log μ(y_t) over the sampled tokens — a one-sample estimate
  of the per-token entropy of the sampling distribution.

Where we depart: the paper's probe sets and k up to 256 need a bigger model and budget to show
shrinkage; here the probe set is the run's eval split and k = ``train.eval_samples``. A completion
with no extracted answer counts as one answer, "none". Token entropy is estimated from the sampled
tokens' log-probs rather than summed over the vocabulary (the engine returns only those). The base
model is the run's first eval (step 0, or the first eval a resumed run recorded: kept in state.json).
"""

from __future__ import annotations

import math
from collections import Counter

from rollwise.types import RolloutGroup

# ``rollwise list diagnostics``: what a run logs that is no stage's method
DIAGNOSTICS = {"support_diag": "with train.eval_samples > 0, every eval logs pass@k, support shrinkage and expansion "
               "against the first eval, answer and token entropy (The Invisible Leash)"}


def answer_entropy(answers: list) -> float:
    """Entropy in nats of the answers' empirical distribution (None is one answer, "none").

    >>> round(answer_entropy(["3", "3", "5", "7"]), 4)
    1.0397
    """
    if not answers:
        raise ValueError("answer_entropy got no answers")
    counts = Counter("none" if a is None else str(a) for a in answers)
    n = len(answers)
    return -sum(c / n * math.log(c / n) for c in counts.values())


def token_entropy(groups: list[RolloutGroup]) -> float:
    """Mean −log μ over every sampled token of ``groups`` (0.0 with no tokens)."""
    lps = [lp for g in groups for r in g.rollouts for lp in r.behavior_logprobs]
    return -sum(lps) / len(lps) if lps else 0.0


def support_change(base: dict[str, bool], now: dict[str, bool]) -> tuple[float, float]:
    """(shrinkage, expansion) over the prompts in both: the share solved by ``base`` and not ``now``,
    and the share solved by ``now`` and not ``base``.

    >>> support_change({"a": True, "b": True, "c": False, "d": False}, {"a": True, "b": False, "c": True, "d": False})
    (0.25, 0.25)
    """
    shared = [p for p in now if p in base]
    if not shared:
        return 0.0, 0.0
    shrink = sum(base[p] and not now[p] for p in shared) / len(shared)
    expand = sum(now[p] and not base[p] for p in shared) / len(shared)
    return shrink, expand


def sample_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    """The entropy diagnostics of the sampled eval groups."""
    return {"eval/answer_entropy": sum(answer_entropy([r.extracted_answer for r in g.rollouts]) for g in groups)
            / len(groups), "eval/token_entropy": token_entropy(groups)}


def track(base: dict[str, bool] | None, prompt_ids: list[str], solved: list[bool]) -> tuple[dict, dict]:
    """(the base solved map — this eval's when ``base`` is None — and the support metrics against it)."""
    now = dict(zip(prompt_ids, solved))
    if base is None:
        base = now
    shrink, expand = support_change(base, now)
    return base, {"eval/support_shrinkage": shrink, "eval/support_expansion": expand}
