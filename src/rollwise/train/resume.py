"""What may change when a run resumes, and the record of each change.

A resumed run continues the computation its checkpoint holds, so the config it resumes with must
describe the same computation. Guaranteed:

- the keys in ``RESUMABLE`` may change — when the run stops (``train.steps``, ``train.max_minutes``,
  ``train.max_generated_tokens``), when it evaluates and saves, what it logs, where the start's eval
  is cached, how many CPU threads it uses: none changes what a step computes. A stop is refused too when the run's computation
  depends on it (``STOP_BOUND``: a cosine/linear LR schedule decays over ``train.steps``; ReMix
  moves its reference at a fraction of the run's budget);
- ``rollout.engine_dtype`` / ``optim.compute_dtype`` may change between ``auto`` and the dtype
  ``auto`` resolved to when the run started (``TrainState.precision``): the same computation;
- any other changed key is refused (``ResumeRefused``, a ``ConfigError``) naming the key, its old and new value and why,
  before the checkpoint is loaded — ``optim.lr``, say, would otherwise be overridden by the
  optimizer state the checkpoint restores, while ``rollout.num_generations`` would silently apply;
- an allowed change applies for real (the trainer is built from the new config), ``config.yaml``
  is rewritten with the new values and ``config_changes.jsonl`` gets one line per key:
  ``{"step", "key", "old", "new"}`` (the step the run resumed from).

Keys present on one side only (a config written by another rollwise version) are not compared.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from rollwise.config import ConfigError

_STOP = "when the run stops"
RESUMABLE = {
    "train.steps": _STOP, "train.max_minutes": _STOP, "train.max_generated_tokens": _STOP,
    "train.eval_every": "when it evaluates", "train.checkpoint_every": "when it saves",
    "train.keep_checkpoints": "how many checkpoints it keeps",
    "train.log_samples": "what it logs", "train.log_rollouts": "what it logs", "train.rollouts_mb": "what it logs",
    "train.report_to": "where it logs",
    "train.eval_cache": "where the start's eval is kept (read only at step 0)",
    # threads: float sums may round in another order, the computation is the same (a resume on another machine)
    "model.threads": "CPU threads", "train.generation_threads": "CPU threads", "train.update_threads": "CPU threads",
}
IDENTITY = ("name", "output_dir")  # the run directory itself: equal by construction
# a precision key changed between `auto` and a dtype is the same computation when `auto` resolved to that dtype
# at the run's start (TrainState.precision): allowed, recorded
PRECISION_KEYS = ("rollout.engine_dtype", "optim.compute_dtype")

# why a section's keys may not change: what the checkpoint holds or the steps done were computed with
REASONS = {
    "optim": "the optimizer and LR schedule the checkpoint restores were built with the old value",
    "objective": "the loss of the steps to come would not be the loss of the steps done",
    "rollout": "the rollouts to come would be sampled otherwise than those the run trained on",
    "control": "the controller's state in the checkpoint belongs to the old settings",
    "replay": "the replay buffer in the checkpoint belongs to the old settings",
    "task": "the data cursor and prompt statistics in the checkpoint belong to the old task",
    "rewards": "the steps done were scored by the old rewards",
    "model": "the policy would be another model, or computed in another dtype or on another device",
    "sft": "the run's starting point was made with the old warm start",
    "seed": "the data order and sampling seeds would change mid-run",
    "sampling_seed": "the sampling seeds would change mid-run",
}


@dataclass(frozen=True)
class Change:
    key: str
    old: object
    new: object

    def __str__(self) -> str:
        return f"{self.key}: {json.dumps(self.old)} → {json.dumps(self.new)}"


def config_changes(old: dict, new: dict, prefix: str = "") -> list[Change]:
    """The leaves that differ between two resolved configs (dotted keys; a section that is null on
    one side and set on the other is one change of the section)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in old if k in new for c in config_changes(old[k], new[k], f"{prefix}{k}.")]
    key = prefix.rstrip(".")
    return [] if old == new or key in IDENTITY else [Change(key, old, new)]


def stop_bound(old: dict, key: str) -> str | None:
    """Why the run's computation depends on stop ``key`` (None: it does not)."""
    if (old.get("replay") or {}).get("method") == "remix":
        return "replay.method=remix moves its reference at a fraction of the run's budget"
    schedule = (old.get("optim") or {}).get("schedule")
    if key == "train.steps" and schedule in ("cosine", "linear"):
        return f"optim.schedule={schedule} decays the LR over train.steps"
    return None


class ResumeRefused(ConfigError):
    """A resume refused because the config describes another computation than the checkpoint's."""


def refusal(old: dict, change: Change, precision: dict | None = None) -> str | None:
    """Why ``change`` may not be made on resume, or None when it may (``precision``: what the run's
    precision keys resolved to at its start)."""
    if change.key in PRECISION_KEYS:
        if precision is None:  # not known before the model loads: judged again by Trainer.prepare
            return None
        resolved = [precision.get(change.key, v) if v == "auto" else v for v in (change.old, change.new)]
        return None if resolved[0] == resolved[1] else f"the run computes in {resolved[0]}"
    if change.key in RESUMABLE:
        return stop_bound(old, change.key) if RESUMABLE[change.key] == _STOP else None
    return REASONS.get(change.key.split(".")[0], "it changes what the run computes")


def check_changes(run_dir: Path, new: dict, precision: dict | None = None) -> list[Change]:
    """The changes resuming ``run_dir`` with config ``new`` (a resolved ``RunConfig`` dump) makes,
    or a ``ResumeRefused`` naming each refused one with its reason and the two ways forward.
    ``precision``: the dtypes the run's precision keys resolved to at its start (``auto`` → that
    dtype is no change of computation; None: not known yet, those keys are not judged)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    old = yaml.safe_load(path.read_text()) or {}
    changes = config_changes(old, new)
    refused = [f"{c} ({why})" for c in changes if (why := refusal(old, c, precision)) is not None]
    if refused:
        more = f"; and {len(refused) - 5} more" if len(refused) > 5 else ""
        raise ResumeRefused(
            f"--resume {run_dir}: {'; '.join(refused[:5])}{more}. On resume only the stop, eval and checkpoint "
            f"cadence, logging and threads may change ({', '.join(RESUMABLE)}). Resume with the values the run "
            f"started with (its own config: rollwise train {path} --resume), or start a new run from this one's "
            f"policy: --set model.path={run_dir} --set name=<new name>")
    return changes


def start_precision(checkpoint: Path) -> dict | None:
    """The precisions a checkpoint's run started in (``state.json``; None: written before runs recorded them)."""
    try:
        return json.loads((checkpoint / "state.json").read_text()).get("precision")
    except (OSError, ValueError):
        return None


def record_changes(run_dir: Path, step: int, changes: list[Change], new: dict) -> None:
    """Write the new config into ``config.yaml`` and one ``config_changes.jsonl`` line per change."""
    if not changes:
        return
    (run_dir / "config.yaml").write_text(yaml.safe_dump(new, sort_keys=False))
    with (run_dir / "config_changes.jsonl").open("a") as f:
        for c in changes:
            f.write(json.dumps({"step": step, **asdict(c)}) + "\n")
