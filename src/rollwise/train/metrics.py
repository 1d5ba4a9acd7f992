"""Run-directory logging: ``metrics.jsonl``, ``samples.jsonl``, and TensorBoard when installed.

A resumed run continues the files of the run it resumes: every line logged after the
checkpoint's step is dropped first (it will be produced again), so the files of a run killed
and resumed equal those of the uninterrupted run line for line (``time/*`` values aside).
TensorBoard's event files cannot be cut that way; the writer is opened with ``purge_step`` so
TensorBoard discards the events after the checkpoint instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, resume_from_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        if resume_from_step is not None:
            for path in (self.path, self.samples_path):
                _truncate_after(path, resume_from_step)
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_from_step is None else resume_from_step + 1
            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
        except ImportError:  # tensorboard is optional
            pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else str(v)) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float):
                    self._tb.add_scalar(k, v, step)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with self.samples_path.open("a") as f:
            for s in samples:
                f.write(json.dumps({"step": step, **s}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _truncate_after(path: Path, step: int) -> None:
    """Keep the lines of a JSONL log whose ``step`` is at most ``step`` (a half-written last line goes too)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept))
    tmp.replace(path)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
