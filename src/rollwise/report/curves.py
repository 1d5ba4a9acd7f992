"""Which curves the report shows, and how: pure functions over the runs' metrics, no plotting.

- **identical series are one curve**: metrics whose values are equal at every step of every run
  (``reward/mean``, ``reward/<name>`` and ``train/pass_rate`` with one 0/1 reward) are plotted once,
  titled with all their names;
- **flat series are folded**: a metric with a single value across every step of every run (all
  zeros, a constant) is listed with that value, not plotted — never dropped;
- **a few curves are key** (``KEY``, shown open); the rest sit in collapsed sections by group;
- **smoothing**: series longer than ``SMOOTH_FROM`` points get a debiased exponential moving
  average (TensorBoard's), drawn over the raw values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollwise.report.runs import Run

# (id, title, name patterns): a pattern ending in "/" is a prefix; otherwise the name itself, or it
# followed by "_" or "/" (kl → kl, kl_prox). A metric goes to the first group that matches it.
GROUPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("reward", "Reward", ("reward/", "train/pass_rate")),
    ("episodes", "Episodes and tool use (tool calls, parse failures and call errors, turns, failed episodes)",
     ("episode/", "episodes/", "harness/")),
    ("label-free", "Label-free RL: pseudo-label accuracy, labelled and skipped groups (majority_vote)",
     ("train/pseudo_label_acc", "majority_vote/")),
    ("support", "Support and entropy on the eval set: shrinkage/expansion against the base model, answer and "
     "token entropy (support_diag)", ("eval/support", "eval/answer_entropy", "eval/token_entropy")),
    ("eval", "Eval accuracy, pass@k and maj@k", ("eval/",)),
    ("length", "Length (mean, max, truncated share)", ("length/",)),
    ("entropy", "Entropy", ("entropy",)),
    ("kl", "KL", ("kl",)),
    ("clip", "Clip ratios", ("clip_ratio/", "clip")),
    ("zero-signal", "Zero-signal share and groups", ("groups/",)),
    ("tis", "Behaviour/trainer mismatch, TIS weights and log-prob gap", ("mismatch/", "tis/", "logprob_gap/")),
    ("strategy", "Strategy, controller, replay and staleness",
     ("tree/", "latr/", "april/", "control/", "arrol/", "replay/", "staleness/", "async/")),
    ("dist", "Rollout workers on Ray (workers, lost, re-issued prompts)", ("dist/",)),
    ("time", "Time split (generate, score, update, wait, weight sync)", ("time/",)),
    ("update", "Update (loss, gradient, LR, advantages)", ("loss", "grad_norm", "lr", "advantage/", "update/")),
    ("tokens", "Tokens and rollouts", ("tokens/", "rollouts/")),
    ("other", "Other metrics", ("",)),
]
TITLES = {g: t for g, t, _ in GROUPS}


def _matches(name: str, pattern: str) -> bool:
    if pattern.endswith("/") or not pattern:
        return name.startswith(pattern)
    return name == pattern or name.startswith(pattern + "_") or name.startswith(pattern + "/")


def group_metrics(names: list[str]) -> dict[str, list[str]]:
    """Metric names by group id, in ``GROUPS`` order; groups with nothing logged are left out.

    >>> group_metrics(["kl", "reward/mean", "kl_prox", "zzz"])
    {'reward': ['reward/mean'], 'kl': ['kl', 'kl_prox'], 'other': ['zzz']}
    """
    out: dict[str, list[str]] = {}
    for name in sorted(names):
        gid = next(g for g, _, patterns in GROUPS if any(_matches(name, p) for p in patterns))
        out.setdefault(gid, []).append(name)
    return {g: out[g] for g, _, _ in GROUPS if g in out}

# the curves shown first, in this order: a metric matches the first pattern it fits (``key_rank``)
KEY = ("eval/accuracy", "eval/pass@", "eval/maj@", "reward/mean", "train/pass_rate", "reward/*", "reward/std",
       "train/pseudo_label_acc",  # label-free RL (majority_vote): is the pseudo-label right?
       # episodes (an agent run): what a user watches first after the reward
       "episode/tool_calls_mean", "episode/parse_failure_rate", "episode/call_error_rate", "episode/turns_mean",
       "harness/calls_mean", "episodes/failed",
       "groups/zero_signal", "length/mean", "length/truncated", "kl", "entropy", "loss")
SMOOTH_FROM = 20  # points; shorter series are drawn raw (with markers)


@dataclass
class Curve:
    names: list[str]  # the metrics this curve stands for (several when their series are identical)
    group: str  # the metric group of its first name (plots_groups.GROUPS)

    @property
    def title(self) -> str:
        return " = ".join(self.names)


@dataclass
class CurvePlan:
    key: list[Curve]  # shown open
    more: dict[str, list[Curve]]  # group id -> curves, each group a collapsed section
    flat: list[tuple[list[str], float]]  # (names, the one value) of the folded series


def key_rank(name: str) -> int | None:
    """The position of ``name`` in ``KEY`` (``reward/*``: a reward function's own mean, ``reward/<fn>``)."""
    for i, pattern in enumerate(KEY):
        if pattern == "reward/*":
            if name.startswith("reward/") and name.count("/") == 1 and name not in ("reward/mean", "reward/std"):
                return i
        elif pattern.endswith("/") or pattern.endswith("@"):
            if name.startswith(pattern):
                return i
        elif name == pattern:
            return i
    return None


def _rounded(v: float) -> float:
    """``v`` to 9 significant digits: equal series computed two ways (a sum, a mean) compare equal."""
    return float(f"{v:.9g}")


def signature(runs: list[Run], name: str) -> tuple:
    """What makes two metrics' curves the same: their (step, value) points in every run."""
    return tuple(tuple((s, _rounded(v)) for s, v in run.series(name)) for run in runs)


def _order(name: str) -> tuple:
    rank = key_rank(name)
    return (rank if rank is not None else len(KEY), name)


def plan_curves(runs: list[Run]) -> CurvePlan:
    """Merge identical series, fold flat ones, split key curves from the rest (see the module docstring)."""
    names = sorted({n for r in runs for n in r.metric_names()}, key=_order)
    merged: dict[tuple, list[str]] = {}
    for name in names:
        merged.setdefault(signature(runs, name), []).append(name)
    key, rest, flat = [], [], []
    for sig, same in merged.items():
        values = {v for points in sig for _, v in points}
        if len(values) <= 1:
            flat.append((same, values.pop() if values else math.nan))
        elif key_rank(same[0]) is not None:
            key.append(Curve(same, next(iter(group_metrics([same[0]])))))
        else:
            rest.append(Curve(same, next(iter(group_metrics([same[0]])))))
    more: dict[str, list[Curve]] = {}
    for gid in group_metrics([c.names[0] for c in rest]):  # GROUPS order
        more[gid] = [c for c in rest if c.group == gid]
    return CurvePlan(key, more, flat)


def smoothing_weight(n: int) -> float:
    """The EMA weight for a series of ``n`` points: 0 (raw) below ``SMOOTH_FROM``, then growing to 0.9.

    >>> smoothing_weight(10), smoothing_weight(30), round(smoothing_weight(300), 2)
    (0.0, 0.6, 0.9)
    """
    if n < SMOOTH_FROM:
        return 0.0
    return min(0.9, 1.0 - 1.0 / max(1.0, n / 12))


def smooth(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's smoothing): the first point is not pulled to 0.

    >>> smooth([1.0, 1.0, 1.0], 0.9)
    [1.0, 1.0, 1.0]
    >>> [round(v, 3) for v in smooth([0.0, 1.0], 0.5)]
    [0.0, 0.667]
    """
    out, last, debias = [], 0.0, 1.0
    for v in values:
        last = weight * last + (1 - weight) * v
        debias *= weight
        out.append(last / (1 - debias) if debias < 1 else v)
    return out
