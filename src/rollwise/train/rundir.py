"""The run directory's files outside checkpoints: ``config.yaml``, the RL starting point
(``init_model/`` or ``init_model.json``), ``summary.json`` and ``report.html``.

A run directory (DESIGN.md) holds ``config.yaml``, ``metrics.jsonl`` and the other logs
(``train/metrics.py``), ``checkpoints/`` (``train/checkpoint.py``), the starting point, the
summary and the report.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import yaml

from rollwise.model import lora
from rollwise.model.load import model_dir

# what a run writes: a fresh run in an existing directory removes them, so nothing stale is resumed later
RUN_FILES = ("metrics.jsonl", "samples.jsonl", "trees.jsonl", "evals.jsonl", "summary.json", "report.html",
             "init_model.json")
RUN_DIRS = ("checkpoints", "init_model")


def start_fresh(run_dir: Path, config: dict) -> None:
    """Write the resolved config (``config.yaml``) and remove what an earlier run left."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for stale in RUN_FILES:
        (run_dir / stale).unlink(missing_ok=True)
    for stale in RUN_DIRS:
        shutil.rmtree(run_dir / stale, ignore_errors=True)


def save_init_model(run_dir: Path, cfg, model, tokenizer) -> None:
    """Keep the RL starting point: a copy in ``init_model/`` when the run made it (SFT warm
    start, a built preset), else only the source directory's path in ``init_model.json`` —
    copying an unchanged 7B model would write 28 GB for nothing."""
    if cfg.sft.steps or cfg.model.path is None:
        lora.save_base(model, run_dir / "init_model")  # model.lora: the base alone
        tokenizer.save_pretrained(run_dir / "init_model")
    else:
        source = str(model_dir(cfg.model).resolve())  # a .gguf or pkg: path: its HF directory
        (run_dir / "init_model.json").write_text(json.dumps({"path": source}, indent=2))


def init_model_dir(run_dir: Path) -> Path:
    """The directory holding the RL starting weights (``init_model/`` or the recorded source)."""
    record = run_dir / "init_model.json"
    return Path(json.loads(record.read_text())["path"]) if record.exists() else run_dir / "init_model"


def write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def write_report(run_dir: Path) -> Path | None:
    """Write ``report.html`` into the run directory (``rollwise.report``); the run's files are
    what it reads. A report that fails logs a warning and returns None: it never fails a run."""
    try:
        from rollwise.report import write_report as report

        return report([run_dir])
    except Exception as err:  # noqa: BLE001 — the report is a view of the run, never a reason to lose it
        logging.getLogger("rollwise").warning("run report not written: %s: %s", type(err).__name__, err)
        return None
