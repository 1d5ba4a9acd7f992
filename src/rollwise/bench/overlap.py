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
  ratio to the tokens ``sync`` itself took to first reach it (the control bench's definition).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.control import tokens_to_reach
from rollwise.bench.engine import _quiet_transformers
from rollwise.bench.ledger import delta
from rollwise.bench.stats import correct_string, departure_step, paired_effect
from rollwise.config import ConfigError, StrictModel, apply_overrides, validate

REPLAY_ARMS = ("rollout_replay", "remix", "rorecomp")
NOISE_FLOOR = "noise_floor"  # sync with sampling_seed = seed + NOISE_SEED_OFFSET
NOISE_SEED_OFFSET = 1_000
ARMS = ("sync", NOISE_FLOOR, "async1", "async2", *REPLAY_ARMS)


class AsyncBenchConfig(StrictModel):
    """Settings of ``rollwise bench async`` (override with ``--set key=value``)."""

    arms: list[Literal[ARMS]] = Field(list(ARMS), min_length=1, description="arms to run (sync = the baseline)")
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="RL seeds per arm (the verdict's unit)")
    steps: int = Field(60, ge=1, description="trained steps per run (equal trained groups across arms)")
    replay_steps_factor: float = Field(
        2.0, ge=1, description="replay arms run this many times `steps` (replay samples fewer tokens per step: the "
        "longer run finds the tokens to the baseline's final accuracy); their equal-steps numbers are read at `steps`")
    eval_every: int = Field(10, ge=1, description="evaluate every N steps (and at the end); must divide `steps`")
    eval_size: int = Field(200, ge=1, description="held-out prompts for greedy accuracy")
    preset: str = Field("tiny", description="model preset (random init, then SFT)")
    sft_steps: int = Field(500, ge=0, description="SFT warm-start steps (the demo's)")
    max_digits: int = Field(5, ge=1, description="arith operand digits up to this (the demo's)")
    max_new_tokens: int = Field(96, ge=1, description="completion limit (the demo's)")
    num_generations: int = Field(8, ge=2, description="rollouts per prompt")
    prompts_per_step: int = Field(16, ge=1, description="groups per step")
    lr: float = Field(3e-5, gt=0, description="GRPO learning rate")
    sync_threads: int = Field(0, ge=0, description="torch threads of sync and replay arms (0 = every core)")
    async_threads: int = Field(0, ge=0, description="torch threads of each async side (0 = half the cores)")


def load_async_bench_config(overrides: list[str]) -> AsyncBenchConfig:
    cfg = validate(AsyncBenchConfig, apply_overrides({}, list(overrides)))
    if cfg.steps % cfg.eval_every:
        raise ConfigError(f"eval_every={cfg.eval_every} must divide steps={cfg.steps} (the equal-steps numbers are "
                          "read at an eval); set eval_every to a divisor of steps")
    return cfg


def run_async_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_async_bench_config(overrides)
    cores = os.cpu_count() or 2
    sync_threads = cfg.sync_threads or cores
    async_threads = cfg.async_threads or max(1, cores // 2)
    threads = torch.get_num_threads()
    try:
        with _quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
            torch.set_num_threads(sync_threads)
            warm = _warm_start(cfg, Path(tmp), console)
            out = {"settings": cfg.model_dump(), "cores": cores, "sync_threads": sync_threads,
                   "async_threads": async_threads, "runs": {arm: [] for arm in cfg.arms}}
            for i, seed in enumerate(cfg.seeds):
                order = cfg.arms[i % len(cfg.arms):] + cfg.arms[: i % len(cfg.arms)]  # rotate the order per seed
                for arm in order:
                    out["runs"][arm].append(_run(cfg, arm, seed, warm, Path(tmp), sync_threads, async_threads,
                                                 console))
                    out["table"] = summarize(out["runs"], cfg.arms, cfg.steps)
                    if json_path is not None:  # a long run keeps what it measured so far
                        json_path.write_text(json.dumps(out, indent=2))
            _print(console, cfg, out)
            return out
    finally:
        torch.set_num_threads(threads)


def _sets(cfg: AsyncBenchConfig) -> list[str]:
    return ["task.name=arith", f"task.max_digits={cfg.max_digits}", f"task.eval_size={cfg.eval_size}",
            f"rollout.max_new_tokens={cfg.max_new_tokens}", f"model.preset={cfg.preset}"]


def _warm_start(cfg: AsyncBenchConfig, tmp: Path, console) -> Path:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with console.status(f"SFT warm start ({cfg.sft_steps} steps)"):
        run = load_run_config(None, [f"output_dir={tmp}", "name=warm", "seed=0", *_sets(cfg),
                                     f"sft.steps={cfg.sft_steps}", "train.steps=0",
                                     f"model.threads={torch.get_num_threads()}"])
        with Trainer(run) as trainer:
            trainer.prepare()
    return trainer.run_dir / "init_model"


def arm_sets(arm: str, sync_threads: int, async_threads: int) -> list[str]:
    """The config lines that make an arm what it is."""
    if arm.startswith("async"):
        return ["train.mode=async", f"train.max_staleness={arm[len('async'):]}",
                f"train.generation_threads={async_threads}", f"train.update_threads={async_threads}"]
    lines = [f"model.threads={sync_threads}"]
    return lines + ([f"replay.method={arm}"] if arm in REPLAY_ARMS else [])


def seed_sets(arm: str, seed: int) -> list[str]:
    """The config lines of an arm's run for ``seed`` (the noise floor's other sampling seed)."""
    return [f"seed={seed}", *([f"sampling_seed={seed + NOISE_SEED_OFFSET}"] if arm == NOISE_FLOOR else [])]


def _run(cfg: AsyncBenchConfig, arm: str, seed: int, warm: Path, tmp: Path, sync_threads: int, async_threads: int,
         console) -> dict:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    run = load_run_config(None, [
        f"output_dir={tmp}", f"name={arm}_{seed}", *seed_sets(arm, seed), *_sets(cfg),
        f"model.path={warm}", "sft.steps=0", "rollout.strategy=group", f"rollout.num_generations={cfg.num_generations}",
        f"rollout.prompts_per_step={cfg.prompts_per_step}", "objective.method=grpo", f"optim.lr={cfg.lr}",
        "optim.micro_batch_size=128", f"train.steps={steps_of(cfg, arm)}", f"train.eval_every={cfg.eval_every}",
        "train.eval_samples=0", "train.log_samples=0", "train.checkpoint_every=0",
        *arm_sets(arm, sync_threads, async_threads),
    ])
    curve, steps, trace = [], [], []
    with console.status(f"{arm}, seed {seed}") as status, Trainer(run) as trainer:
        trainer.prepare()

        def on_eval(step, result):
            curve.append({"step": step, "wall": trainer.state.wall_seconds, "tokens": trainer.state.generated_tokens,
                          "accuracy": result.accuracy, "correct": correct_string(result.correct)})

        def on_step(step, metrics):
            steps.append({k: v for k, v in metrics.items() if k.startswith(("staleness/", "async/", "replay/", "time/"))
                          or k in ("tokens/generated",)})
            trace.append([metrics.get("tokens/generated"), metrics.get("reward/mean")])
            status.update(f"{arm}, seed {seed}, step {step}/{steps_of(cfg, arm)}")

        summary = trainer.fit(on_step=on_step, on_eval=on_eval)
    return {"seed": seed, "curve": curve, "wall_seconds": summary["wall_seconds"],
            "final_accuracy": summary["final_accuracy"], "initial_accuracy": summary["initial_accuracy"],
            "generated_tokens": summary["generated_tokens"], "step_metrics": steps, "trace": trace}


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
    table = {}
    for arm in arms:
        rs = runs.get(arm) or []
        if not rs:
            continue
        speed, at_wall, base_at_wall, token_ratios = [], [], [], []
        for r in rs:
            b = base.get(r["seed"])
            if b is None:
                continue
            mine, theirs = at_step(r, steps), at_step(b, steps)
            speed.append(theirs["wall"] / mine["wall"])
            wall = min(theirs["wall"], mine["wall"])  # the faster run's time to `steps`
            at_wall.append(accuracy_at_wall(r["curve"], wall))
            base_at_wall.append(accuracy_at_wall(b["curve"], wall))
            target = theirs["accuracy"]
            reached = tokens_to_reach([(c["tokens"], c["accuracy"]) for c in r["curve"]], target)
            base_reached = tokens_to_reach([(c["tokens"], c["accuracy"]) for c in b["curve"] if c["step"] <= steps],
                                           target)
            if reached is not None and base_reached:
                token_ratios.append(reached / base_reached)
        ends = [at_step(r, steps) for r in rs]
        acc = [c["accuracy"] for c in ends]
        last = [r["step_metrics"][-1] for r in rs if r["step_metrics"]]
        idle = {side: statistics.mean(m.get(f"async/{side}_idle_s", 0.0) / r["wall_seconds"]
                                      for m, r in zip(last, rs)) for side in ("generate", "update")}
        table[arm] = {
            "wall_seconds": statistics.mean(c["wall"] for c in ends),
            "speedup_vs_sync": statistics.mean(speed) if speed else None, "speedups": speed,
            "accuracy_mean": statistics.mean(acc), "accuracy_spread": max(acc) - min(acc), "accuracies": acc,
            "accuracy_at_equal_wall": statistics.mean(at_wall) if at_wall else None,
            "sync_accuracy_at_that_wall": statistics.mean(base_at_wall) if base_at_wall else None,
            "initial_accuracy": rs[0]["initial_accuracy"],
            "staleness": {str(k): v for k, v in staleness_histogram([m for r in rs for m in r["step_metrics"]]).items()},
            "idle_fraction": idle,
            "tokens_ratio": statistics.mean(token_ratios) if token_ratios else None, "reached": len(token_ratios),
            "tokens_at_steps": statistics.mean(c["tokens"] for c in ends),
            "final_accuracy_mean": statistics.mean(r["final_accuracy"] for r in rs), "seeds": len(rs),
        } | ({} if arm == "sync" else effect_at_steps(rs, base, steps))
    return table


def effect_at_steps(rs: list[dict], base: dict[int, dict], steps: int) -> dict:
    """The arm's accuracy at ``steps`` against ``sync``'s, paired by seed and prompt (runs whose evals
    keep ``correct``), and the first of the first ``steps`` steps its runs depart from ``sync``'s."""
    mine = {r["seed"]: r for r in rs}
    seeds = [s for s in mine if s in base]
    if not seeds or not all("correct" in at_step(r, steps) for r in [*(mine[s] for s in seeds),
                                                                        *(base[s] for s in seeds)]):
        return {}
    e = paired_effect({s: at_step(mine[s], steps)["correct"] for s in seeds},
                      {s: at_step(base[s], steps)["correct"] for s in seeds})
    departs = [departure_step(mine[s]["trace"][:steps], base[s]["trace"][:steps]) for s in seeds if "trace" in mine[s]]
    return {k: v for k, v in e.as_dict().items() if k != "seeds"} | {
        "departs_at": min((d for d in departs if d is not None), default=None)}


def _print(console, cfg: AsyncBenchConfig, out: dict) -> None:
    table = out["table"]
    first = next(iter(table.values()))
    t = Table(title=f"arith (demo), {cfg.steps} steps x {cfg.prompts_per_step} groups of {cfg.num_generations}, "
                    f"{len(cfg.seeds)} seeds, greedy accuracy on {cfg.eval_size} held-out prompts (warm start "
                    f"{first['initial_accuracy']:.1%}); {out['cores']} cores: sync {out['sync_threads']} threads, "
                    f"async {out['async_threads']} + {out['async_threads']}; Δ paired by seed and prompt, 95% t "
                    "interval over seeds")
    for col in ("arm", "wall s", "speed-up vs sync", "acc. at equal steps", "Δ vs sync [95% CI]", "verdict",
                "departs at step", "acc. at equal wall",
                "sync there", "tokens at equal steps", "staleness 0/1/2/3+", "idle gen/upd", "tokens to sync's final"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    for arm, row in table.items():
        st = row["staleness"]
        ratio = "—" if row["tokens_ratio"] is None else f"{row['tokens_ratio']:.2f}x ({row['reached']}/{row['seeds']})"
        t.add_row(arm, f"{row['wall_seconds']:.0f}",
                  "—" if row["speedup_vs_sync"] is None else f"{row['speedup_vs_sync']:.2f}x",
                  f"{row['accuracy_mean']:.1%}", delta(row), row.get("verdict", "—"),
                  "—" if "difference" not in row else str(row["departs_at"] or "never"),
                  "—" if row["accuracy_at_equal_wall"] is None else f"{row['accuracy_at_equal_wall']:.1%}",
                  "—" if row["sync_accuracy_at_that_wall"] is None else f"{row['sync_accuracy_at_that_wall']:.1%}",
                  f"{row['tokens_at_steps']:,.0f}",
                  "/".join(f"{st.get(str(k), 0.0):.0%}" for k in range(3))
                  + f"/{sum(v for k, v in st.items() if int(k) >= 3):.0%}",
                  f"{row['idle_fraction']['generate']:.0%}/{row['idle_fraction']['update']:.0%}", ratio)
    console.print(t)
