"""Run-directory logging: ``metrics.jsonl``, ``samples.jsonl``, and TensorBoard when installed."""

from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLog:
    def __init__(self, run_dir: Path, resume_from_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        if resume_from_step is not None and self.path.exists():
            # drop lines logged after the checkpoint we resume from: they will be produced again
            kept = [ln for ln in self.path.read_text().splitlines() if json.loads(ln).get("step", 0) <= resume_from_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        self._tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
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


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []
