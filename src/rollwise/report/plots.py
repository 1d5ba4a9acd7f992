"""The report's curves: metric groups, each one PNG (a row per metric; columns: over steps,
generated tokens and wall time; one colour per run). Only what a run logged is plotted.

matplotlib is imported here, lazily, with the Agg backend: no screen, no GUI toolkit.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from rollwise.report.runs import X_AXES, Run

# one colour per run, in the plots and in the page's tables (matplotlib's tab10)
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]

# (id, title, name patterns): a pattern ending in "/" is a prefix; otherwise the name itself, or it
# followed by "_" or "/" (kl → kl, kl_prox). A metric goes to the first group that matches it.
GROUPS: list[tuple[str, str, tuple[str, ...]]] = [
    ("reward", "Reward", ("reward/", "train/pass_rate")),
    ("eval", "Eval accuracy, pass@k and maj@k", ("eval/",)),
    ("length", "Length (mean, max, truncated share)", ("length/",)),
    ("entropy", "Entropy", ("entropy",)),
    ("kl", "KL", ("kl",)),
    ("clip", "Clip ratios", ("clip_ratio/", "clip")),
    ("zero-signal", "Zero-signal share and groups", ("groups/",)),
    ("tis", "TIS weights and log-prob gap", ("tis/", "logprob_gap/")),
    ("strategy", "Strategy, controller, replay and staleness",
     ("tree/", "latr/", "april/", "control/", "arrol/", "replay/", "staleness/", "async/")),
    ("dist", "Rollout workers on Ray (workers, lost, re-issued prompts)", ("dist/",)),
    ("time", "Time split (generate, score, update, wait, weight sync)", ("time/",)),
    ("update", "Update (loss, gradient, LR, advantages)", ("loss", "grad_norm", "lr", "advantage/", "update/")),
    ("tokens", "Tokens and rollouts", ("tokens/", "rollouts/")),
    ("other", "Other metrics", ("",)),
]


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


@dataclass
class Figure:
    id: str  # the group id
    title: str
    metrics: list[str]
    png: str  # base64 PNG


def plot_groups(runs: list[Run]) -> list[Figure]:
    """One figure per metric group that any run logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for r in runs for n in r.metric_names()})
    titles = {g: t for g, t, _ in GROUPS}
    colours = [COLOURS[i % len(COLOURS)] for i in range(len(runs))]
    xs = [r.x_of() for r in runs]
    figures = []
    for gid, metrics in group_metrics(names).items():
        rows, height = len(metrics), 1.9 * len(metrics) + 0.5
        fig, axes = plt.subplots(rows, len(X_AXES), figsize=(12, height), squeeze=False, dpi=72, sharex="col")
        # fixed margins in inches: tight_layout would draw every figure twice
        fig.subplots_adjust(left=0.06, right=0.99, top=1 - 0.3 / height, bottom=0.45 / height, wspace=0.18,
                            hspace=0.55 * rows / height)
        for row, metric in enumerate(metrics):
            for col, axis in enumerate(X_AXES):
                ax = axes[row][col]
                for run, x, colour in zip(runs, xs, colours):
                    points = [(x[axis][s], v) for s, v in run.series(metric) if s in x[axis]]
                    if points:
                        style = "o-" if len(points) < 12 else "-"
                        ax.plot(*zip(*points), style, color=colour, label=run.name, markersize=3, linewidth=1.2)
                ax.set_title(metric if col == 0 else "", fontsize=9, loc="left")
                ax.tick_params(labelsize=7)
                ax.locator_params(nbins=4)
                ax.grid(alpha=0.3)
                if row == len(metrics) - 1:
                    ax.set_xlabel(X_AXES[axis], fontsize=8)
        if len(runs) > 1:
            axes[0][0].legend(fontsize=7, loc="best")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        figures.append(Figure(gid, titles[gid], metrics, base64.b64encode(buf.getvalue()).decode("ascii")))
    return figures
