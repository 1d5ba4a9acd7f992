"""``rollwise report``: one self-contained ``report.html`` for one run or several overlaid.

Reads only the run directory (``metrics.jsonl``, ``rollouts.jsonl``, ``samples.jsonl``,
``trees.jsonl``, ``config.yaml``, ``summary.json``); needs no server and no network. ``rollwise train`` writes
one at the end of every run (``Trainer.write_report``).
"""

from __future__ import annotations

from pathlib import Path

from rollwise.report.page import render_page
from rollwise.report.runs import load_runs


def write_report(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Write the report of ``run_dirs`` to ``out`` (default: ``RUN_DIR/report.html`` for one run,
    ``./report.html`` for several); returns the path written."""
    runs = load_runs(run_dirs)
    out = Path(out) if out is not None else (runs[0].path / "report.html" if len(runs) == 1 else Path("report.html"))
    html = render_page(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return out
