"""``rollwise bench control``: controllers side by side at an equal generated-token budget.

For each task (``arith``, ``countdown``) one warm start (SFT of the ``tiny`` preset, seed 0)
is shared by every arm. Each arm — ``none`` (the ``group`` baseline) and each controller —
runs GRPO from it for every seed in ``seeds`` until the engine has sampled ``tokens``
tokens (``RunLimits(generated_tokens=...)``), evaluating greedy accuracy on the held-out split
every ``eval_every`` steps and at the end. Arms and seeds alternate in one process, so they
share the machine's state.

Reported per task and arm:

- eval accuracy at the budget: mean and spread (max − min) over seeds;
- the effect against ``none``, paired by seed and prompt (the same eval prompts on a seed), with
  its 95% t interval over seeds, p and verdict (``rollwise.bench.stats``), and the first step at
  which the arm's runs sampled other tokens or rewards than ``none``'s (``departs_at``);
- the noise floor (``noise_floor: true``): ``none`` again with other rollout-sampling seeds
  (``sampling_seed`` = seed + 1000), judged by the same rule — it must read "no detectable
  difference";
- generated tokens to reach the baseline's final accuracy: for each seed, the first eval at
  which the arm's accuracy is at least the same seed's ``none`` final accuracy, as a ratio to
  the tokens ``none`` itself took to first reach it (geometric mean over seeds, with its interval;
  a seed that never reached it counts at the tokens of its last eval, a lower bound, and the cell
  shows ``≥``; ``reached`` counts the seeds that did);
- the share of trained groups with zero signal (all rewards equal), over every step;
- wall time per run (mean), and the controller's own metrics (``control/*``, step means).

Absolute wall times on a shared machine are noise; token counts are deterministic for a seed.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.compare import (departs_at, metric_means, paired, ratio_cell, tokens_ratio_fields, tokens_to_reach,
                                    zero_signal_share)
from rollwise.bench.harness import (NOISE_FLOOR, TaskBenchConfig, grid, load_settings, rl_sets, seed_sets,
                                    session, table, task_sets, task_warm_start, threads_set, train_run, write_json)
from rollwise.bench.ledger import control_line, delta, verdict_cell
from rollwise.bench.stats import add_holm
from rollwise.control import CONTROLLERS, EPISODES_ONLY

__all__ = ["NOISE_FLOOR", "run_control_bench", "summarize", "tokens_to_reach", "zero_signal_share"]
ARMS = tuple(n for n in CONTROLLERS if n not in EPISODES_ONLY)  # the bench tasks are single-turn
KEEP = ("control/", "arrol/", "groups/zero_signal", "groups/trained", "rollouts/trained", "tokens/generated")


class ControlBenchConfig(TaskBenchConfig):
    """Settings of ``rollwise bench control`` (override with ``--set key=value``)."""

    arms: list[Literal[tuple(ARMS)]] = Field(list(ARMS), min_length=1,
                                             description="controllers to run (none = baseline)")
    eval_every: int = Field(4, ge=1, description="arith: evaluate every N steps (and at the end)")
    countdown_eval_every: int = Field(8, ge=1, description="countdown: evaluate every N steps (and at the end)")
    control: list[str] = Field([], description="extra control.* overrides for every arm, e.g. 'vade.pool_size=256'")


def run_control_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_settings(ControlBenchConfig, overrides)
    with session(cfg.threads) as tmp:
        out = {"settings": cfg.model_dump(), "torch_threads": torch.get_num_threads(), "tasks": {}}
        for task in cfg.tasks:
            warm = task_warm_start(cfg, task, tmp, console)
            runs = _arms(cfg, task, warm, tmp, console)
            out["tasks"][task] = {"runs": runs, "table": summarize(runs, list(runs))}
            write_json(json_path, out)  # a long run keeps what it measured so far
            _print(console, cfg, task, out["tasks"][task]["table"])
        return out


def _arms(cfg: ControlBenchConfig, task: str, warm: Path, tmp: Path, console) -> dict[str, list[dict]]:
    """Every arm on every seed from the warm start, to the task's token budget."""
    arms = [*cfg.arms, *([NOISE_FLOOR] if cfg.noise_floor else [])]
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    every = cfg.eval_every if task == "arith" else cfg.countdown_eval_every
    for seed, arm in grid(cfg.seeds, arms):
        method = "none" if arm == NOISE_FLOOR else arm
        sets = [*rl_sets(cfg, tmp, f"{task}_{arm}_{seed}", seed, warm, every), threads_set(), *task_sets(cfg, task),
                "rollout.strategy=group", "objective.method=grpo", f"control.method={method}",
                *[f"control.{s}" for s in cfg.control], *seed_sets(arm, seed)]
        run = train_run(sets, console, f"{task}: {arm}, seed {seed}", tokens=cfg.budget(task), keep=KEEP)
        runs[arm].append(run.record(seed) | {"curve": run.curve, "steps": len(run.steps), "step_metrics": run.steps,
                                             "correct": run.evals[-1]["correct"]})
    return runs


def tokens_per_trained_rollout(step_metrics: list[dict]) -> float:
    """Tokens the engine sampled (every round, pruned rollouts included) per rollout the update trained on."""
    return sum(m.get("tokens/generated", 0.0) for m in step_metrics) / max(
        sum(m.get("rollouts/trained", 0.0) for m in step_metrics), 1)


def summarize(runs: dict[str, list[dict]], arms: list[str]) -> dict[str, dict]:
    """Per arm: accuracy mean/spread, the paired effect against ``none`` and where its runs depart
    from ``none``'s, tokens-to-baseline ratio, zero-signal share, wall, controller metrics."""
    base = {r["seed"]: r for r in runs.get("none", [])}
    table = {}
    for arm in arms:
        rs = runs[arm]
        acc = [r["final_accuracy"] for r in rs]
        control = metric_means([m for r in rs for m in r["step_metrics"]])
        table[arm] = {
            "accuracy_mean": statistics.mean(acc), "accuracy_spread": max(acc) - min(acc), "accuracies": acc,
            "initial_accuracy": rs[0]["initial_accuracy"],
            **tokens_ratio_fields({r["seed"]: r for r in rs}, base), "seeds": len(rs),
            "zero_signal_share": statistics.mean(zero_signal_share(r["step_metrics"]) for r in rs),
            "wall_seconds": statistics.mean(r["wall_seconds"] for r in rs),
            "steps": statistics.mean(r["steps"] for r in rs), "control": control,
            "tokens_per_trained_rollout": statistics.mean(tokens_per_trained_rollout(r["step_metrics"]) for r in rs),
        } | ({} if arm == "none" else _against(rs, base))
    add_holm(table, [arm for arm in table if arm not in ("none", NOISE_FLOOR)])  # the family-wise reading
    return table


def _against(rs: list[dict], base: dict[int, dict]) -> dict:
    """The paired effect against ``none`` and the step the runs depart from its (none: no correctness)."""
    mine = {r["seed"]: r for r in rs}
    effect = paired(mine, base, lambda r: r.get("correct"))
    return effect | {"departs_at": departs_at(mine, base)} if effect else {}


def _print(console, cfg: ControlBenchConfig, task: str, rows: dict) -> None:
    first = next(iter(rows.values()))
    title = (f"{task}: GRPO at {cfg.budget(task):,} generated tokens per run, {len(cfg.seeds)} seeds, greedy accuracy "
             f"on {cfg.eval_size} held-out prompts (warm start {first['initial_accuracy']:.1%}); Δ paired by "
             "seed and prompt, 95% t interval over seeds")
    columns = ("arm", "accuracy", "Δ vs none [95% CI]", "verdict", "departs at step", "tokens to baseline's final",
               "zero-signal groups", "tokens/trained rollout", "steps", "wall s")
    console.print(table(title, columns, [
        [arm, f"{r['accuracy_mean']:.1%}", delta(r), verdict_cell(r),
         "—" if "difference" not in r else ("never" if r["departs_at"] is None else str(r["departs_at"])),
         ratio_cell(r), f"{r['zero_signal_share']:.1%}", f"{r['tokens_per_trained_rollout']:.1f}",
         f"{r['steps']:.0f}", f"{r['wall_seconds']:.0f}"] for arm, r in rows.items()], left=("verdict",)))
    for arm, r in rows.items():
        if acted := control_line(r):
            console.print(f"  {arm}: {acted}", highlight=False, soft_wrap=True)
