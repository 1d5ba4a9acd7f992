"""Compare two run directories file by file: what "a resumed run equals the uninterrupted run" means.

Every file of one run must exist in the other with the same content, except wall-clock
measurements (``time/*`` metrics, ``wall_seconds``, ``cpu_seconds``) and the run's own name. JSONL and JSON
files are compared record by record; checkpoint tensors, optimizer and RNG states by value;
anything else byte for byte. TensorBoard event files hold timestamps and are skipped (the
writer purges events after a resumed checkpoint instead), and so is ``report.html``: a view of
the other files whose curves over wall time differ run to run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file

from rollwise.train.pipeline import TIMING_METRICS

IGNORED_KEYS = ("wall_seconds", "cpu_seconds", "name", *TIMING_METRICS)


def _clean(record):
    if dataclasses.is_dataclass(record) and not isinstance(record, type):  # async batches in pipeline.pt
        record = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if isinstance(record, dict):
        return {k: _clean(v) for k, v in record.items()
                if not (isinstance(k, str) and k.startswith("time/")) and k not in IGNORED_KEYS}
    if isinstance(record, (list, tuple)):
        return [_clean(v) for v in record]
    if isinstance(record, set):
        return sorted(record)
    return record


def _equal(a, b) -> bool:
    if isinstance(a, (torch.Tensor, np.ndarray)):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def load_for_compare(path: Path):
    if path.suffix == ".jsonl":
        return [_clean(json.loads(line)) for line in path.read_text().splitlines()]
    if path.suffix == ".json":
        return _clean(json.loads(path.read_text()))
    if path.suffix == ".yaml":
        return _clean(yaml.safe_load(path.read_text()))
    if path.suffix == ".safetensors":
        return load_file(str(path))
    if path.suffix == ".pt":
        return _clean(torch.load(path, weights_only=False))
    return path.read_bytes()


def run_files(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                  if p.is_file() and "tensorboard" not in p.parts and p.name != "report.html")


def assert_same_run(a: Path, b: Path) -> list[str]:
    """Assert runs ``a`` and ``b`` hold the same files with the same contents; return the file list."""
    files = run_files(a)
    assert files == run_files(b), (files, run_files(b))
    for rel in files:
        left, right = load_for_compare(a / rel), load_for_compare(b / rel)
        if isinstance(left, list) and isinstance(right, list) and rel.endswith(".jsonl"):
            assert len(left) == len(right), (rel, len(left), len(right))
            for i, (x, y) in enumerate(zip(left, right)):
                assert _equal(x, y), (rel, i + 1, x, y)
        else:
            assert _equal(left, right), rel
    return files


class Crash(Exception):
    """Raised inside ``Trainer.fit`` by ``crash_and_resume``: the run stops as a killed one would."""


def crash_and_resume(config, crash_at: int, on_crash=None, on_resume=None) -> tuple[Path, Path]:
    """Fit run ``full`` to the end; fit run ``cut`` and raise inside the loop once step
    ``crash_at`` is logged (``on_crash(trainer)`` first, e.g. to write what a kill would lose),
    then resume ``cut`` from its last checkpoint (``on_resume(trainer)`` before it goes on) and
    fit it to the end. ``config(name)`` gives each run's RunConfig. Returns both run directories."""
    from rollwise.train.loop import Trainer

    with Trainer(config("full")) as full:
        full.prepare()
        full.fit()

    with Trainer(config("cut")) as first:
        first.prepare()

        def crash(step, _metrics):
            if step == crash_at:
                if on_crash is not None:
                    on_crash(first)
                raise Crash

        try:
            first.fit(on_step=crash)
        except Crash:
            pass
        else:
            raise AssertionError(f"the run ended before step {crash_at}")
    with Trainer(config("cut")) as resumed:
        resumed.prepare(resume=True)
        if on_resume is not None:
            on_resume(resumed)
        resumed.fit()
    return full.run_dir, resumed.run_dir


def kill_and_resume(run_dir: Path, sets: list[str], kill_after: str) -> tuple[Path, Path]:
    """Run ``rollwise train --set ...`` to the end as ``whole``; run it again as ``killed``,
    SIGKILL it once ``checkpoints/<kill_after>`` exists, and ``--resume`` it to the end.
    Returns the two run directories (under ``run_dir``) for ``assert_same_run``."""
    cli = [sys.executable, "-m", "rollwise.cli", "train"]

    def args(name):
        return cli + sum((["--set", s] for s in [f"output_dir={run_dir}", f"name={name}", *sets]), [])

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(args("whole"), check=True, capture_output=True, env=env, timeout=300)
    proc = subprocess.Popen(args("killed"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while not (run_dir / "killed" / "checkpoints" / kill_after).exists():
        assert proc.poll() is None and time.time() < deadline, "run ended before its checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL  # it died mid-run, not after finishing
    assert not (run_dir / "killed" / "summary.json").exists()
    subprocess.run(args("killed") + ["--resume"], check=True, capture_output=True, env=env, timeout=300)
    return run_dir / "whole", run_dir / "killed"
