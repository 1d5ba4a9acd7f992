"""Each arm against its baseline: paired by seed and prompt (``paired``), where its sampling first
departed from the baseline's (``departs_at``), the generated tokens it took to reach the baseline's
final accuracy (``tokens_ratio_fields``, shown by ``ratio_cell``), and what its
steps did (``zero_signal_share``, ``metric_means``). Runs are ``{seed: run}``: a bench's
records (``rollwise.bench.harness.Run.record`` and what the bench adds, ``curve``, ``correct``); the statistics are ``rollwise.bench.stats``'.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping

from rollwise.bench.stats import departure_step, paired_effect, seed_test


def paired(mine: Mapping[int, dict], base: Mapping[int, dict], correct: Callable[[dict], str | None]) -> dict:
    """The arm's effect against the baseline on the seeds both ran (``{seed: run}``), paired by seed
    and prompt (``rollwise.bench.stats.paired_effect``; ``seeds`` left out); {} when a run has no
    per-prompt correctness (``correct(run)`` None)."""
    seeds = [s for s in mine if s in base]
    if not seeds or any(correct(r) is None for r in [*(mine[s] for s in seeds), *(base[s] for s in seeds)]):
        return {}
    e = paired_effect({s: correct(mine[s]) for s in seeds}, {s: correct(base[s]) for s in seeds})
    return {k: v for k, v in e.as_dict().items() if k != "seeds"}


def departs_at(mine: Mapping[int, dict], base: Mapping[int, dict], steps: int | None = None) -> int | None:
    """The first step at which the arm's runs (``{seed: run}`` with a ``trace``) sampled other tokens
    or rewards than the baseline's on the same seed, over the first ``steps`` (None: all): the
    earliest over seeds; None when they never did."""
    found = [departure_step(mine[s]["trace"][:steps], base[s]["trace"][:steps])
             for s in mine if s in base and "trace" in mine[s]]
    return min((d for d in found if d is not None), default=None)


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """Generated tokens at the first eval with accuracy >= ``target`` (None: never).

    >>> tokens_to_reach([(0, .4), (100, .6), (200, .7)], .6)
    100
    """
    return next((t for t, acc in curve if acc >= target - 1e-12), None)


def censored_tokens_ratios(mine: Mapping[int, dict], base: Mapping[int, dict]) -> list[tuple[float, bool]]:
    """``tokens_ratios`` without leaving out the seeds where the arm never reached the baseline's final
    accuracy: each seed's ``(ratio, reached)``, a seed that never reached it at the tokens of its
    last eval over the baseline's — a lower bound, the ratio it would have at best (its reached False).
    Leaving those seeds out would read an arm from its lucky seeds only.

    >>> base = {0: {"final_accuracy": .5, "curve": [(0, .3), (100, .5)]}}
    >>> censored_tokens_ratios({0: {"curve": [(0, .3), (50, .5)]}}, base)
    [(0.5, True)]
    >>> censored_tokens_ratios({0: {"curve": [(0, .3), (150, .4)]}}, base)
    [(1.5, False)]
    """
    out = []
    for s in (s for s in mine if s in base):
        target, curve = base[s]["final_accuracy"], mine[s]["curve"]
        reached, theirs = tokens_to_reach(curve, target), tokens_to_reach(base[s]["curve"], target)
        if theirs and (reached is not None or curve):
            out.append((reached / theirs, True) if reached is not None else (curve[-1][0] / theirs, False))
    return out


def ratio_mean(ratios: list[float]) -> tuple[float | None, list[float] | None]:
    """The geometric mean of per-seed ratios and its 95% t interval over seeds, taken on the log
    scale and mapped back (None below one ratio / two): a ratio's interval stays positive, and 2× and
    0.5× lie equally far from 1.

    >>> ratio_mean([0.5, 2.0])[0]
    1.0
    >>> ratio_mean([0.5, 0.5, 0.5])
    (0.5, [0.5, 0.5])
    """
    if not ratios:
        return None, None
    mean, ci, _ = seed_test([math.log(r) for r in ratios])
    return round(math.exp(mean), 12), None if ci is None else [round(math.exp(x), 12) for x in ci]


def tokens_ratio_fields(mine: Mapping[int, dict], base: Mapping[int, dict]) -> dict:
    """A row's second number: the generated tokens the arm took to reach the baseline's final accuracy
    over the baseline's own, per seed both ran (``censored_tokens_ratios``: a seed that never reached it
    counts at its lower bound) — the geometric mean and its interval (``ratio_mean``), the seeds that
    reached it (``reached``) of those compared (``tokens_ratio_seeds``).

    >>> base = {s: {"final_accuracy": .5, "curve": [(0, .3), (100, .5)]} for s in (0, 1)}
    >>> tokens_ratio_fields({0: {"curve": [(50, .5)]}, 1: {"curve": [(200, .4)]}}, base)["reached"]
    1
    """
    ratios = censored_tokens_ratios(mine, base)
    ratio, ci = ratio_mean([x for x, _ in ratios])
    return {"tokens_ratio": ratio, "tokens_ratio_ci95": ci, "reached": sum(r for _, r in ratios),
            "tokens_ratio_seeds": len(ratios)}


def never_reached(row: dict) -> int:
    """The row's seeds that never reached the baseline's final accuracy (their tokens ratio only a lower
    bound); 0 for a row written before they were counted."""
    return row.get("tokens_ratio_seeds", row.get("reached", 0)) - row.get("reached", 0)


def ratio_cell(row: dict) -> str:
    """'≥0.85× (3/5) [0.52, 1.39]': tokens to the baseline's final accuracy (≥ when a seed never
    reached it: the ratio is then a lower bound), the seeds that reached it, and its interval.

    >>> ratio_cell({"tokens_ratio": .85, "reached": 3, "tokens_ratio_seeds": 5, "seeds": 5})
    '≥0.85× (3/5)'
    """
    if row.get("tokens_ratio") is None:
        return "—"
    cell = f"{'≥' if never_reached(row) else ''}{row['tokens_ratio']:.2f}× ({row['reached']}/{row['seeds']})"
    if row.get("tokens_ratio_ci95"):
        lo, hi = row["tokens_ratio_ci95"]
        cell += f" [{lo:.2f}, {hi:.2f}]"
    return cell


def zero_signal_share(step_metrics: list[dict]) -> float:
    """Trained groups with zero signal (no reward spread) over all steps / trained groups.

    >>> zero_signal_share([{"groups/zero_signal": .5, "groups/trained": 8},
    ...                    {"groups/zero_signal": 0, "groups/trained": 8}])
    0.25
    """
    zero = sum(m.get("groups/zero_signal", 0.0) * m.get("groups/trained", 0.0) for m in step_metrics)
    return zero / max(sum(m.get("groups/trained", 0.0) for m in step_metrics), 1)


def metric_means(step_metrics: list[dict], prefixes: tuple[str, ...] = ("control/", "arrol/")) -> dict[str, float]:
    """The mean of each metric named with one of ``prefixes`` over the steps that logged it (what a
    controller did: rounds, refills, picked pass rates), by name.

    >>> metric_means([{"control/pool": 2, "x": 1}, {"control/pool": 4}])
    {'control/pool': 3}
    """
    keys = sorted({k for m in step_metrics for k in m if k.startswith(prefixes)})
    return {k: statistics.mean(m[k] for m in step_metrics if k in m) for k in keys}
