"""The run directory's files outside checkpoints: ``config.yaml``, the RL starting point
(``init_model/`` or ``init_model.json``), ``summary.json`` and ``report.html``.

A run directory (DESIGN.md) holds ``config.yaml``, ``metrics.jsonl`` and the other logs
(``train/metrics.py``), ``checkpoints/`` (``train/checkpoint.py``), the starting point, the
summary and the report.

Nothing a user made is lost implicitly: a fresh run refuses a directory that already holds a
run (``check_start``: continue it with resume, pick another name, or say overwrite), and
overwrite removes only the files and directories listed in ``RUN_FILES`` / ``RUN_DIRS``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import yaml

from rollwise.config import ConfigError
from rollwise.model import lora
from rollwise.model.load import model_source
from rollwise.train.checkpoint import latest_checkpoint

# what a run writes: a directory holding any of them holds a run (a fresh run refuses it), and
# --overwrite removes exactly these — other files a user keeps there stay
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "trees.jsonl", "evals.jsonl", "rollouts.jsonl",
             "config_changes.jsonl", "summary.json", "report.html", "init_model.json", "sft.jsonl")
RUN_DIRS = ("checkpoints", "init_model", "tensorboard", "wandb")


def run_files(run_dir: Path) -> list[str]:
    """What rollwise wrote in ``run_dir`` (directories end in ``/``); empty: no run there."""
    return [n for n in RUN_FILES if (run_dir / n).is_file()] + [f"{n}/" for n in RUN_DIRS if (run_dir / n).is_dir()]


def check_start(run_dir: Path, resume: bool = False, overwrite: bool = False) -> Path | None:
    """The checkpoint a ``resume`` continues from (None for a fresh run), or a ConfigError when the
    directory does not allow it: a fresh run never replaces a run unless ``overwrite`` says so."""
    if resume and overwrite:
        raise ConfigError("--resume continues the run and --overwrite replaces it: choose one")
    found = run_files(run_dir)
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None and found:
            raise ConfigError(f"--resume: {run_dir} has no checkpoint yet (checkpoints/step_N/, written every "
                              "train.checkpoint_every steps and at the end): the run stopped before its first; "
                              "start it again with --overwrite")
        if ckpt is None:
            raise ConfigError(f"--resume: no checkpoint to continue from, {run_dir} holds no run (drop --resume to "
                              "start it, or check name and output_dir)")
        return ckpt
    if found and not overwrite:
        ckpt = latest_checkpoint(run_dir)
        held = f"checkpoints up to step {int(ckpt.name.removeprefix('step_'))}" if ckpt else "no checkpoint"
        raise ConfigError(f"{run_dir} already holds a run ({held}); nothing was changed. Continue it with --resume, "
                          f"start another with --set name=<new name>, or replace it with --overwrite (removes "
                          f"what rollwise wrote there: {', '.join(found)}; other files stay)")
    return None


def start_fresh(run_dir: Path, config: dict, overwrite: bool = False) -> None:
    """Write the resolved config (``config.yaml``) into a directory holding no run — with
    ``overwrite``, after removing the files an earlier run wrote (``run_files``)."""
    check_start(run_dir, overwrite=overwrite)
    for name in run_files(run_dir):
        if name.endswith("/"):
            shutil.rmtree(run_dir / name)
        else:
            (run_dir / name).unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def save_init_model(run_dir: Path, cfg, model, tokenizer) -> None:
    """Keep the RL starting point: a copy in ``init_model/`` when the run made it (SFT warm start,
    a built preset, another run's policy built from its checkpoint), else only the source
    directory's path in ``init_model.json`` — copying an unchanged 7B model would write 28 GB for nothing."""
    source, policy = (None, None) if cfg.model.path is None else model_source(cfg.model)
    if cfg.sft.steps or source is None or policy is not None:
        lora.save_base(model, run_dir / "init_model")  # model.lora: the base alone
        tokenizer.save_pretrained(run_dir / "init_model")
    else:  # a .gguf or pkg: path: its HF directory
        (run_dir / "init_model.json").write_text(json.dumps({"path": str(source.resolve())}, indent=2))


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
