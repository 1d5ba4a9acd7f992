"""The report's curves as PNGs: one figure per curve (``report/curves.py`` decides which), one
column per x axis asked for, one colour per run; a long series drawn smoothed over its raw values.

matplotlib is imported here, lazily, with the Agg backend: no screen, no GUI toolkit.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from rollwise.report.curves import GROUPS, Curve, group_metrics, smooth, smoothing_weight  # noqa: F401 (re-exported)
from rollwise.report.html import COLOURS
from rollwise.report.runs import X_AXES, Run


@dataclass
class Figure:
    id: str  # unique in the page
    title: str
    metrics: list[str]  # every metric the curve stands for
    png: str  # base64 PNG


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(ax, points: list[tuple[float, float]], colour: str, label: str) -> None:
    """Raw values faint under their moving average when the series is long; else the raw line."""
    xs, ys = zip(*points)
    weight = smoothing_weight(len(points))
    if weight:
        ax.plot(xs, ys, "-", color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(xs, smooth(list(ys), weight), "-", color=colour, label=label, linewidth=1.6)
    else:
        ax.plot(xs, ys, "o-" if len(points) < 12 else "-", color=colour, label=label, markersize=3, linewidth=1.2)


def render_curve(runs: list[Run], curve: Curve, axes: list[str], fig_id: str, x_of: list[dict]) -> Figure:
    """One curve over ``axes`` (keys of ``X_AXES``), every run overlaid."""
    plt = _pyplot()
    width = 4.4 if len(axes) == 1 else 4.0 * len(axes)
    fig, row = plt.subplots(1, len(axes), figsize=(width, 2.5), squeeze=False, dpi=80)
    # fixed margins in inches: tight_layout would draw every figure twice
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, top=0.93, bottom=0.2, wspace=0.22)
    metric = curve.names[0]  # the others are the same series
    for col, axis in enumerate(axes):
        ax = row[0][col]
        for i, (run, x) in enumerate(zip(runs, x_of)):
            points = [(x[axis][s], v) for s, v in run.series(metric) if s in x[axis]]
            if points:
                _draw(ax, points, COLOURS[i % len(COLOURS)], run.name)
        ax.tick_params(labelsize=7)
        ax.locator_params(nbins=5)
        ax.grid(alpha=0.3)
        ax.set_xlabel(X_AXES[axis], fontsize=8)
    if len(runs) > 1:
        row[0][0].legend(fontsize=7, loc="best")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return Figure(fig_id, curve.title, list(curve.names), base64.b64encode(buf.getvalue()).decode("ascii"))


def render_curves(runs: list[Run], curves: list[Curve], axes: list[str], prefix: str) -> list[Figure]:
    """A figure per curve, ids ``<prefix>-<n>``."""
    x_of = [r.x_of() for r in runs]
    return [render_curve(runs, c, axes, f"{prefix}-{i}", x_of) for i, c in enumerate(curves)]
