"""``rollwise bench async``: synchronous vs asynchronous training, and replay against no replay.

One SFT warm start of the demo's task (``arith``, the ``tiny`` preset) is shared by every arm.
Each arm runs GRPO from it for every seed in ``seeds`` for the same number of steps (so the
same number of trained groups; replay arms run ``replay_steps_factor`` times longer, so that
their curve reaches the baseline's final accuracy, and their equal-steps numbers are read at
``steps``), evaluating greedy accuracy every ``eval_every`` steps; arms
run one after another in one process (never two at once: each has the whole machine), their
order rotated per seed so drift on a shared machine spreads over all of them.

Arms: ``sync`` (``train.mode: sync``, torch on every core — the baseline), ``async1`` and
``async2`` (``train.mode: async``, ``max_staleness`` 1 and 2; ``generation_threads`` =
``update_threads`` = half the cores), and one arm per replay method (``rollout_replay``,
``remix``, ``rorecomp``; sync mode, same threads as ``sync``), and ``noise_floor``: ``sync`` again
with other rollout-sampling seeds (``sampling_seed`` = seed + 1000; same warm start, data order and
eval set), judged by the same rule as every arm — it must read "no detectable difference".

Reported per arm (mean over seeds, spread = max − min):

- wall time to ``steps`` trained steps, and its ratio to ``sync`` (per seed, then averaged);
- eval accuracy at equal steps (the last eval) and at equal wall time (each arm's last eval
  at or before the fastest arm's finishing time, per seed);
- the effect on accuracy at equal steps against ``sync``, paired by seed and prompt, with its
  95% t interval over seeds, p and verdict (``rollwise.bench.stats``), and the first step at
  which the arm's runs sampled other tokens or rewards than ``sync``'s (``departs_at``);
- the staleness histogram of trained tokens (share at 0, 1, 2 versions behind);
- generation and update idle fractions (async: each side's waiting time / wall time);
- for replay arms: generated tokens to reach the ``sync`` arm's accuracy at ``steps``, as a
  ratio to the tokens ``sync`` itself took to first reach it (the control bench's definition: a
  seed that never reached it counts at its lower bound, shown ``≥``).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Literal

from pydantic import Field

from rollwise.bench.compare import departs_at, paired, ratio_cell, tokens_ratio_fields
from rollwise.bench.harness import (NOISE_FLOOR, GrpoBenchConfig, grid, load_settings, rl_sets, seed_sets,
                                    session, table, threads_set, train_run, warm_start, write_json)
from rollwise.bench.ledger import delta, verdict_cell
from rollwise.bench.stats import add_holm
from rollwise.config import ConfigError

REPLAY_ARMS = ("rollout_replay", "remix", "rorecomp")
ARMS = ("sync", NOISE_FLOOR, "async1", "async2", *REPLAY_ARMS)
KEEP = ("staleness/", "async/", "replay/", "time/", "tokens/generated")


class AsyncBenchConfig(GrpoBenchConfig):
    """Settings of ``rollwise bench async`` (override with ``--set key=value``): the demo's arith."""

    arms: list[Literal[ARMS]] = Field(list(ARMS), min_length=1, description="arms to run (sync = the baseline)")
    steps: int = Field(60, ge=1, description="trained steps per run (equal trained groups across arms)")
    replay_steps_factor: float = Field(
        2.0, ge=1, description="replay arms run this many times `steps` (replay samples fewer tokens per step: the "
        "longer run finds the tokens to the baseline's final accuracy); their equal-steps numbers are read at `steps`")
    eval_every: int = Field(10, ge=1, description="evaluate every N steps (and at the end); must divide `steps`")
    max_digits: int = Field(5, ge=1, description="arith operand digits up to this (the demo's)")
    max_new_tokens: int = Field(96, ge=1, description="completion limit (the demo's)")
    sync_threads: int = Field(0, ge=0, description="torch threads of sync and replay arms (0 = every core)")
    async_threads: int = Field(0, ge=0, description="torch threads of each async side (0 = half the cores)")


def load_async_bench_config(overrides: list[str]) -> AsyncBenchConfig:
    cfg = load_settings(AsyncBenchConfig, overrides)
    if cfg.steps % cfg.eval_every:
        raise ConfigError(f"eval_every={cfg.eval_every} must divide steps={cfg.steps} (the equal-steps numbers are "
                          "read at an eval); set eval_every to a divisor of steps")
    return cfg


def run_async_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_async_bench_config(overrides)
    cores = os.cpu_count() or 2
    sync_threads = cfg.sync_threads or cores
    async_threads = cfg.async_threads or max(1, cores // 2)
    with session(sync_threads) as tmp:
        warm = warm_start(tmp, "warm", ["seed=0", *_sets(cfg), f"sft.steps={cfg.sft_steps}", threads_set()], console)
        out = {"settings": cfg.model_dump(), "cores": cores, "sync_threads": sync_threads,
               "async_threads": async_threads, "runs": {arm: [] for arm in cfg.arms}}
        for seed, arm in grid(cfg.seeds, cfg.arms, rotate=True):  # drift on a shared machine hits every arm
            sets = [*rl_sets(cfg, tmp, f"{arm}_{seed}", seed, warm, cfg.eval_every, steps_of(cfg, arm)),
                    *seed_sets(arm, seed), *_sets(cfg), "rollout.strategy=group", "objective.method=grpo",
                    *arm_sets(arm, sync_threads, async_threads)]
            run = train_run(sets, console, f"{arm}, seed {seed}", keep=KEEP)
            out["runs"][arm].append(run.record(seed) | {"curve": run.evals, "step_metrics": run.steps})
            out["table"] = summarize(out["runs"], cfg.arms, cfg.steps)
            write_json(json_path, out)  # a long run keeps what it measured so far
        _print(console, cfg, out)
        return out


def _sets(cfg: AsyncBenchConfig) -> list[str]:
    return ["task.name=arith", f"task.max_digits={cfg.max_digits}", f"task.eval_size={cfg.eval_size}",
            f"rollout.max_new_tokens={cfg.max_new_tokens}", f"model.preset={cfg.preset}"]


def arm_sets(arm: str, sync_threads: int, async_threads: int) -> list[str]:
    """The config lines that make an arm what it is."""
    if arm.startswith("async"):
        return ["train.mode=async", f"train.max_staleness={arm[len('async'):]}",
                f"train.generation_threads={async_threads}", f"train.update_threads={async_threads}"]
    lines = [f"model.threads={sync_threads}"]
    return lines + ([f"replay.method={arm}"] if arm in REPLAY_ARMS else [])


def steps_of(cfg: AsyncBenchConfig, arm: str) -> int:
    """Steps an arm runs: ``steps``, or ``replay_steps_factor`` × that for replay arms."""
    return round(cfg.steps * cfg.replay_steps_factor) if arm in REPLAY_ARMS else cfg.steps


def at_step(run: dict, step: int) -> dict:
    """The run's eval record at ``step`` (its last one if it stopped earlier)."""
    return next((c for c in run["curve"] if c["step"] == step), run["curve"][-1])


def accuracy_at_wall(curve: list[dict], wall: float) -> float:
    """The accuracy of the last eval at or before ``wall`` seconds (the first eval if none).

    >>> accuracy_at_wall([{"wall": 0, "accuracy": .4}, {"wall": 10, "accuracy": .6}, {"wall": 20, "accuracy": .7}], 15)
    0.6
    """
    seen = [c["accuracy"] for c in curve if c["wall"] <= wall + 1e-9]
    return seen[-1] if seen else curve[0]["accuracy"]


def staleness_histogram(step_metrics: list[dict]) -> dict[int, float]:
    """Share of trained tokens sampled k versions behind, averaged over steps."""
    keys = sorted({int(k.rsplit("_", 1)[1]) for m in step_metrics for k in m if k.startswith("staleness/share_")})
    n = max(len(step_metrics), 1)
    return {k: sum(m.get(f"staleness/share_{k}", 0.0) for m in step_metrics) / n for k in keys}


def summarize(runs: dict[str, list[dict]], arms: list[str], steps: int) -> dict[str, dict]:
    """Per arm, over seeds: wall time and accuracy at ``steps`` (equal trained groups), the speed-up
    over ``sync`` (its wall / the arm's, per seed), accuracy at the faster run's finishing time,
    the staleness histogram, idle fractions, and tokens to ``sync``'s final accuracy."""
    base = {r["seed"]: r for r in runs.get("sync", [])}
    rows = {}
    for arm in arms:
        rs = runs.get(arm) or []
        if not rs:
            continue
        speed, at_wall, base_at_wall = [], [], []
        for r in rs:
            b = base.get(r["seed"])
            if b is None:
                continue
            mine, theirs = at_step(r, steps), at_step(b, steps)
            speed.append(theirs["wall"] / mine["wall"])
            wall = min(theirs["wall"], mine["wall"])  # the faster run's time to `steps`
            at_wall.append(accuracy_at_wall(r["curve"], wall))
            base_at_wall.append(accuracy_at_wall(b["curve"], wall))
        ends = [at_step(r, steps) for r in rs]
        acc = [c["accuracy"] for c in ends]
        last = [r["step_metrics"][-1] for r in rs if r["step_metrics"]]
        idle = {side: statistics.mean(m.get(f"async/{side}_idle_s", 0.0) / r["wall_seconds"]
                                      for m, r in zip(last, rs)) for side in ("generate", "update")}
        rows[arm] = {
            "wall_seconds": statistics.mean(c["wall"] for c in ends),
            "speedup_vs_sync": statistics.mean(speed) if speed else None, "speedups": speed,
            "accuracy_mean": statistics.mean(acc), "accuracy_spread": max(acc) - min(acc), "accuracies": acc,
            "accuracy_at_equal_wall": statistics.mean(at_wall) if at_wall else None,
            "sync_accuracy_at_that_wall": statistics.mean(base_at_wall) if base_at_wall else None,
            "initial_accuracy": rs[0]["initial_accuracy"],
            "staleness": {str(k): v for k, v in
                          staleness_histogram([m for r in rs for m in r["step_metrics"]]).items()},
            "idle_fraction": idle,
            **tokens_to_sync_final(rs, base, steps),
            "tokens_at_steps": statistics.mean(c["tokens"] for c in ends),
            "final_accuracy_mean": statistics.mean(r["final_accuracy"] for r in rs), "seeds": len(rs),
        } | ({} if arm == "sync" else effect_at_steps(rs, base, steps))
    add_holm(rows, [arm for arm in rows if arm not in ("sync", NOISE_FLOOR)])  # the family-wise reading
    return rows


def tokens_to_sync_final(rs: list[dict], base: dict[int, dict], steps: int) -> dict:
    """Generated tokens to reach ``sync``'s accuracy at ``steps``, over ``sync``'s own, per seed with a
    ``sync`` run (``tokens_ratio_fields``: geometric mean, never-reached seeds at their lower bound)."""
    mine, theirs = {}, {}
    for r in rs:
        b = base.get(r["seed"])
        if b is None:
            continue
        mine[r["seed"]] = {"curve": [(c["tokens"], c["accuracy"]) for c in r["curve"]]}
        theirs[r["seed"]] = {"final_accuracy": at_step(b, steps)["accuracy"],
                             "curve": [(c["tokens"], c["accuracy"]) for c in b["curve"] if c["step"] <= steps]}
    return tokens_ratio_fields(mine, theirs)


def effect_at_steps(rs: list[dict], base: dict[int, dict], steps: int) -> dict:
    """The arm's accuracy at ``steps`` against ``sync``'s, paired by seed and prompt (runs whose evals
    keep ``correct``), and the first of the first ``steps`` steps its runs depart from ``sync``'s."""
    mine = {r["seed"]: r for r in rs}
    effect = paired(mine, base, lambda r: at_step(r, steps).get("correct"))
    return effect | {"departs_at": departs_at(mine, base, steps)} if effect else {}


def _print(console, cfg: AsyncBenchConfig, out: dict) -> None:
    first = next(iter(out["table"].values()))
    title = (f"arith (demo), {cfg.steps} steps x {cfg.prompts_per_step} groups of {cfg.num_generations}, "
             f"{len(cfg.seeds)} seeds, greedy accuracy on {cfg.eval_size} held-out prompts (warm start "
             f"{first['initial_accuracy']:.1%}); {out['cores']} cores: sync {out['sync_threads']} threads, "
             f"async {out['async_threads']} + {out['async_threads']}; Δ paired by seed and prompt, 95% t "
             "interval over seeds")
    columns = ("arm", "wall s", "speed-up vs sync", "acc. at equal steps", "Δ vs sync [95% CI]", "verdict",
               "departs at step", "acc. at equal wall", "sync there", "tokens at equal steps", "staleness 0/1/2/3+",
               "idle gen/upd", "tokens to sync's final")
    console.print(table(title, columns, [_cells(arm, row) for arm, row in out["table"].items()]))


def _cells(arm: str, row: dict) -> list[str]:
    def pct(x):
        return "—" if x is None else f"{x:.1%}"

    st, idle = row["staleness"], row["idle_fraction"]
    return [arm, f"{row['wall_seconds']:.0f}",
            "—" if row["speedup_vs_sync"] is None else f"{row['speedup_vs_sync']:.2f}x",
            pct(row["accuracy_mean"]), delta(row), verdict_cell(row),
            "—" if "difference" not in row else str(row["departs_at"] or "never"),
            pct(row["accuracy_at_equal_wall"]), pct(row["sync_accuracy_at_that_wall"]),
            f"{row['tokens_at_steps']:,.0f}",
            "/".join(f"{st.get(str(k), 0.0):.0%}" for k in range(3))
            + f"/{sum(v for k, v in st.items() if int(k) >= 3):.0%}",
            f"{idle['generate']:.0%}/{idle['update']:.0%}", ratio_cell(row)]
