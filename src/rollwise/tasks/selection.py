"""``task.select``: train on prompts chosen by the starting model's own pass@k.

``rollwise calibrate`` (``rollwise.train.calibrate``) samples k completions for each of the first
N train prompts and records how many were correct. A prompt is **never** solved (0 of k),
**always** solved (k of k: GRPO's group has no signal either way) or **mixed**. Selection then
serves a train pool with the shares a recipe asks for — a third of each by default, the regime
where prompt selection and rollout allocation claim their gains (DAPO's dynamic sampling, VADE,
difficulty-targeted selection, XRPO) — visited in a fresh seeded order each epoch.

Guarantees: a selected prompt is the very prompt that was calibrated (its question text is
checked against the calibration, and the task's settings too: a changed config is a
``ConfigError`` asking for a new calibration); prompt ids stay ``train-<index>``, so per-prompt
statistics follow a prompt across epochs; the eval split is not touched.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.tasks.base import ListSource, PromptSource
from rollwise.types import Prompt

BUCKETS = ("never", "mixed", "always")


class SelectConfig(StrictModel):
    """Which calibrated prompts to train on (``rollwise calibrate`` writes ``path``)."""

    path: str = Field(description="the calibration JSON `rollwise calibrate` wrote for this task and model")
    never: float = Field(1.0, ge=0, description="share of train prompts the starting model never solved (0 of k)")
    mixed: float = Field(1.0, ge=0, description="share it solved sometimes (1..k-1 of k)")
    always: float = Field(1.0, ge=0, description="share it always solved (k of k)")

    def shares(self) -> dict[str, float]:
        return {b: getattr(self, b) for b in BUCKETS}


def bucket(correct: int, k: int) -> str:
    """``never`` / ``mixed`` / ``always`` for ``correct`` of ``k`` samples.

    >>> bucket(0, 8), bucket(3, 8), bucket(8, 8)
    ('never', 'mixed', 'always')
    """
    return "never" if correct == 0 else "always" if correct == k else "mixed"


def task_fingerprint(task_cfg) -> dict:
    """The task settings a calibration holds for: everything but ``select`` (which reads it)."""
    return task_cfg.model_dump(mode="json", exclude={"select"})


def load_calibration(path: str | Path) -> dict:
    """A calibration file; a relative path is read from the working directory, else the recipe's."""
    from rollwise.imports import find_file

    try:
        p = find_file(str(path), "task.select.path")
        if not p.is_file():
            raise ConfigError(f"task.select.path: file '{p}' not found")
    except ConfigError as err:
        raise ConfigError(f"{err}; write it with `rollwise calibrate RECIPE --out {path}`") from None
    try:
        data = json.loads(p.read_text())
        data["k"], data["prompts"]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"task.select.path: {str(p)!r} is not a calibration `rollwise calibrate` wrote") from None
    return data


def choose(rows: list[dict], k: int, shares: dict[str, float]) -> list[dict]:
    """The largest pool with the asked shares: the first rows (by index) of each bucket.

    >>> rows = [{"index": i, "correct": c} for i, c in enumerate([0, 0, 0, 4, 4, 8])]
    >>> [r["index"] for r in choose(rows, 8, {"never": 1, "mixed": 1, "always": 1})]
    [0, 3, 5]
    """
    ordered = sorted(rows, key=lambda r: r["index"])
    by = {b: [r for r in ordered if bucket(r["correct"], k) == b] for b in BUCKETS}
    wanted = {b: s for b, s in shares.items() if s > 0}
    if not wanted:
        raise ConfigError("task.select: every share is 0; give never, mixed or always a positive share")
    empty = [b for b in wanted if not by[b]]
    if empty:
        counts = ", ".join(f"{b} {len(by[b])}" for b in BUCKETS)
        raise ConfigError(f"task.select: the calibration has no {empty[0]!r} prompt ({counts} of {len(rows)}); "
                          f"set task.select.{empty[0]}: 0, calibrate more prompts, or change the datasets' difficulty")
    total = sum(wanted.values())
    scale = min(len(by[b]) * total / s for b, s in wanted.items())  # pool size the scarcest bucket allows
    picked = [r for b, s in wanted.items() for r in by[b][: max(1, int(scale * s / total))]]
    return sorted(picked, key=lambda r: r["index"])


def select(train: PromptSource, task_cfg, run_seed: int) -> ListSource:
    """The selected train pool of ``train`` (the task built from the calibrated settings), as a
    ``ListSource`` shuffled per epoch by ``run_seed``."""
    cfg: SelectConfig = task_cfg.select
    data = load_calibration(cfg.path)
    seed = task_cfg.data_seed_for(run_seed)
    if data.get("data_seed") != seed:
        raise ConfigError(f"task.select.path: {cfg.path!r} calibrated the prompts of data seed {data.get('data_seed')}"
                          f"; this run draws seed {seed}'s: set task.data_seed: {data.get('data_seed')}")
    if data.get("task") != task_fingerprint(task_cfg):
        raise ConfigError(f"task.select.path: {cfg.path!r} was calibrated for other task settings; re-run "
                          "`rollwise calibrate` on this recipe (the task section must match, but for task.select)")
    prompts: list[Prompt] = []
    for row in choose(data["prompts"], int(data["k"]), cfg.shares()):
        prompt = train.get(int(row["index"]))
        if prompt.text != row["text"]:
            raise ConfigError(f"task.select.path: train prompt {row['index']} is {prompt.text[:60]!r} here but "
                              f"{row['text'][:60]!r} in the calibration (another reasoning-gym version or seed?); "
                              "re-run `rollwise calibrate`")
        prompts.append(prompt)
    return ListSource(prompts, run_seed)


def split(rows: list[dict], k: int) -> dict[str, int]:
    """How many calibrated prompts fall in each bucket."""
    return {b: sum(bucket(r["correct"], k) == b for r in rows) for b in BUCKETS}
