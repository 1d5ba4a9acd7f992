"""``rollwise bench update``: the policy update with and without skipping zero-advantage rows.

Two trainers with the same recipe, seed and warm start — one with
``optim.skip_zero_advantage=true``, one with ``false`` — take ``steps`` training steps in
turn, in one process (alternating, so a change in the machine's load hits both arms alike).
Skipping changes no number of the update (``tests/test_loop.py`` checks the gradients are
equal), so the two runs train the same way and differ only in what the update runs.
Reported per arm: mean ``time/update``, ``time/generate`` and ``time/step``; the share of
rows skipped and of zero-signal groups; and the ratio of update times, measured side by side.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.engine import _quiet_transformers
from rollwise.config import StrictModel, apply_overrides, validate


class UpdateBenchConfig(StrictModel):
    """Settings of ``rollwise bench update`` (override with ``--set key=value``)."""

    recipe: str | None = Field("recipes/demo.yaml", description="the recipe both arms run (null = defaults)")
    overrides: list[str] = Field([], description="extra key=value overrides for the recipe")
    steps: int = Field(40, ge=1, description="training steps per arm")
    seed: int = Field(0, description="run seed of both arms")
    threads: int = Field(1, ge=0, description="torch threads (0 = the recipe's); 1 is steadiest on shared machines")


def run_update_bench(overrides: list[str], console) -> dict:
    cfg = validate(UpdateBenchConfig, apply_overrides({}, list(overrides)))
    with _quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
        out = _run(cfg, Path(tmp), console)
    _print(console, out)
    return out


def _run(cfg: UpdateBenchConfig, tmp: Path, console) -> dict:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    base = [f"output_dir={tmp}", f"seed={cfg.seed}", "train.checkpoint_every=0", "train.eval_every=0",
            *([f"model.threads={cfg.threads}"] if cfg.threads else []), *cfg.overrides]
    with console.status("SFT warm start"):
        warm = Trainer(load_run_config(cfg.recipe, [*base, "name=warm", "train.steps=0"]))
        warm.prepare()
        warm_dir = warm.init_model_dir()
    arms = {}
    for skip in (True, False):
        run = load_run_config(cfg.recipe, [*base, f"name=skip_{skip}", f"model.path={warm_dir}", "sft.steps=0",
                                           f"optim.skip_zero_advantage={str(skip).lower()}"])
        arms[skip] = Trainer(run)
        arms[skip].prepare()
    rows: dict[bool, list[dict]] = {True: [], False: []}
    with console.status("update arms") as status:
        for step in range(cfg.steps):
            for skip in ((True, False) if step % 2 == 0 else (False, True)):  # alternate who goes first
                status.update(f"step {step + 1}/{cfg.steps}, skip_zero_advantage={skip}")
                rows[skip].append(arms[skip].step())
    for t in arms.values():
        t.close()

    def mean(skip, key):
        return sum(m[key] for m in rows[skip]) / len(rows[skip])

    out = {"settings": cfg.model_dump(), "torch_threads": torch.get_num_threads()}
    for skip, name in ((True, "skip"), (False, "no_skip")):
        out[name] = {k: mean(skip, k) for k in ("time/update", "time/generate", "time/score", "time/step",
                                                 "update/skipped_rows", "groups/zero_signal", "reward/mean")}
    out["update_time_ratio"] = out["skip"]["time/update"] / out["no_skip"]["time/update"]
    out["step_time_ratio"] = out["skip"]["time/step"] / out["no_skip"]["time/step"]
    # the two arms train identically up to float rounding; report how far their losses drifted
    out["max_loss_difference"] = max(abs(a["loss"] - b["loss"]) for a, b in zip(rows[True], rows[False]))
    return out


def _print(console, out: dict) -> None:
    table = Table(title="policy update: skip zero-advantage rows vs run every row (side by side, alternating)")
    for col in ("arm", "update s/step", "generate s/step", "step s", "rows skipped", "zero-signal groups"):
        table.add_column(col)
    for name in ("skip", "no_skip"):
        a = out[name]
        table.add_row(name, f"{a['time/update']:.3f}", f"{a['time/generate']:.3f}", f"{a['time/step']:.3f}",
                      f"{a['update/skipped_rows']:.0%}", f"{a['groups/zero_signal']:.0%}")
    console.print(table)
    console.print(f"update time ratio (skip / no skip): {out['update_time_ratio']:.2f}×; "
                  f"step time ratio: {out['step_time_ratio']:.2f}×; "
                  f"max loss difference between the arms: {out['max_loss_difference']:.2e}")
