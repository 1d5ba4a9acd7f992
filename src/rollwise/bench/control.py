"""``rollwise bench control``: controllers side by side at an equal generated-token budget.

For each task (``arith``, ``countdown``) one warm start (SFT of the ``tiny`` preset, seed 0)
is shared by every arm. Each arm — ``none`` (the ``group`` baseline) and each controller —
runs GRPO from it for every seed in ``seeds`` until the engine has sampled ``tokens``
tokens (``Until(generated_tokens=...)``), evaluating greedy accuracy on the held-out split
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
  the tokens ``none`` itself took to first reach it (mean over the seeds that reached it;
  ``reached`` counts them);
- the share of trained groups with zero signal (all rewards equal), over every step;
- wall time per run (mean), and the controller's own metrics (``control/*``, step means).

Absolute wall times on a shared machine are noise; token counts are deterministic for a seed.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.engine import _quiet_transformers
from rollwise.bench.ledger import delta
from rollwise.bench.stats import correct_string, departure_step, paired_effect
from rollwise.config import StrictModel, apply_overrides, validate
from rollwise.control import CONTROLLERS

ARMS = tuple(CONTROLLERS)
NOISE_FLOOR = "noise_floor"  # `none` with sampling_seed = seed + NOISE_SEED_OFFSET
NOISE_SEED_OFFSET = 1_000


class ControlBenchConfig(StrictModel):
    """Settings of ``rollwise bench control`` (override with ``--set key=value``)."""

    arms: list[Literal[tuple(ARMS)]] = Field(list(ARMS), min_length=1, description="controllers to run (none = baseline)")
    tasks: list[Literal["arith", "countdown"]] = Field(["arith", "countdown"], min_length=1, description="tasks")
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="RL seeds per arm (the verdict's unit)")
    noise_floor: bool = Field(True, description="also run `none` with other sampling seeds, judged by the same rule: "
                              "it must read 'no detectable difference'")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default)")
    preset: str = Field("tiny", description="model preset (random init, then SFT)")
    sft_steps: int = Field(500, ge=0, description="SFT warm-start steps per task")
    tokens: int = Field(100_000, ge=1, description="arith: generated-token budget of every run")
    countdown_tokens: int = Field(80_000, ge=1, description="countdown: generated-token budget of every run")
    num_generations: int = Field(8, ge=2, description="rollouts per prompt (the budget per prompt)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step")
    lr: float = Field(3e-5, gt=0, description="GRPO learning rate")
    eval_every: int = Field(4, ge=1, description="arith: evaluate every N steps (and at the end)")
    countdown_eval_every: int = Field(8, ge=1, description="countdown: evaluate every N steps (and at the end)")
    eval_size: int = Field(200, ge=1, description="held-out prompts for greedy accuracy")
    arith_max_digits: int = Field(5, ge=1, description="arith: operand digits up to this (the demo's mix)")
    arith_max_new_tokens: int = Field(96, ge=1, description="arith completion limit")
    countdown_max_new_tokens: int = Field(32, ge=1, description="countdown completion limit")
    countdown_max_numbers: int = Field(3, ge=3, le=6, description="countdown: most numbers given per prompt (3: the "
                                       "tiny model learns from 19% within the budget; with 4 it does not)")
    control: list[str] = Field([], description="extra control.* overrides for every arm, e.g. 'vade.pool_size=256'")


def load_control_bench_config(overrides: list[str]) -> ControlBenchConfig:
    return validate(ControlBenchConfig, apply_overrides({}, list(overrides)))


def run_control_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_control_bench_config(overrides)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        with _quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
            out = {"settings": cfg.model_dump(), "torch_threads": torch.get_num_threads(), "tasks": {}}
            for task in cfg.tasks:
                warm = warm_start(cfg, task, Path(tmp), console)
                runs = _arms(cfg, task, warm, Path(tmp), console)
                out["tasks"][task] = {"runs": runs, "table": summarize(runs, list(runs))}
                if json_path is not None:  # a long run keeps what it measured so far
                    json_path.write_text(json.dumps(out, indent=2))
                _print(console, cfg, task, out["tasks"][task]["table"])
            return out
    finally:
        torch.set_num_threads(threads)


def task_sets(cfg, task: str) -> list[str]:
    """The config lines of a task at a bench's settings (``arith_*``, ``countdown_*``, ``eval_size`` fields)."""
    if task == "arith":
        return ["task.name=arith", f"task.max_digits={cfg.arith_max_digits}", f"task.eval_size={cfg.eval_size}",
                f"rollout.max_new_tokens={cfg.arith_max_new_tokens}"]
    return ["task.name=countdown", f"task.eval_size={cfg.eval_size}", "task.min_numbers=3",
            f"task.max_numbers={cfg.countdown_max_numbers}",
            f"rollout.max_new_tokens={cfg.countdown_max_new_tokens}"]


def warm_start(cfg, task: str, tmp: Path, console) -> Path:
    """SFT warm start of ``task`` at a bench's settings (``preset``, ``sft_steps``, task fields) in ``tmp/warm_<task>``."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with console.status(f"{task}: SFT warm start ({cfg.sft_steps} steps)"):
        run = load_run_config(None, [f"output_dir={tmp}", f"name=warm_{task}", "seed=0", f"model.preset={cfg.preset}",
                                     *task_sets(cfg, task), f"sft.steps={cfg.sft_steps}", "train.steps=0",
                                     f"model.threads={torch.get_num_threads()}"])
        with Trainer(run) as trainer:
            trainer.prepare()
    return trainer.run_dir / "init_model"


def _arms(cfg: ControlBenchConfig, task: str, warm: Path, tmp: Path, console) -> dict[str, list[dict]]:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer, Until

    arms = [*cfg.arms, *([NOISE_FLOOR] if cfg.noise_floor else [])]
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    tokens, every = (cfg.tokens, cfg.eval_every) if task == "arith" else (cfg.countdown_tokens, cfg.countdown_eval_every)
    with console.status(f"{task}: arms") as status:
        for seed in cfg.seeds:
            for arm in arms:
                method = "none" if arm == NOISE_FLOOR else arm
                sampling = [f"sampling_seed={seed + NOISE_SEED_OFFSET}"] if arm == NOISE_FLOOR else []
                run = load_run_config(None, [
                    f"output_dir={tmp}", f"name={task}_{arm}_{seed}", f"seed={seed}", f"model.path={warm}",
                    f"model.threads={torch.get_num_threads()}", *task_sets(cfg, task), "sft.steps=0",
                    "rollout.strategy=group", f"rollout.num_generations={cfg.num_generations}",
                    f"rollout.prompts_per_step={cfg.prompts_per_step}", "objective.method=grpo", f"optim.lr={cfg.lr}",
                    "optim.micro_batch_size=128", "train.steps=100000", f"train.eval_every={every}",
                    "train.eval_samples=0", "train.log_samples=0", "train.checkpoint_every=0",
                    f"control.method={method}", *[f"control.{s}" for s in cfg.control], *sampling,
                ])
                curve, steps, evals, trace = [], [], [], []
                with Trainer(run) as trainer:
                    trainer.prepare()

                    def on_eval(step, result, trainer=trainer):
                        curve.append((trainer.state.generated_tokens, result.accuracy))
                        evals.append(correct_string(result.correct))

                    def on_step(step, metrics, arm=arm, seed=seed, trainer=trainer):
                        steps.append({k: v for k, v in metrics.items()
                                      if k.startswith(("control/", "arrol/"))
                                      or k in ("groups/zero_signal", "groups/trained", "rollouts/trained",
                                               "tokens/generated")})
                        trace.append([metrics.get("tokens/generated"), metrics.get("reward/mean")])
                        status.update(f"{task}: {arm}, seed {seed}, step {step}, "
                                      f"{trainer.state.generated_tokens:,}/{tokens:,} tokens")

                    summary = trainer.fit(Until(generated_tokens=tokens), on_step=on_step, on_eval=on_eval)
                runs[arm].append({"seed": seed, "curve": curve, "steps": len(steps), "wall_seconds": summary["wall_seconds"],
                                  "final_accuracy": summary["final_accuracy"], "initial_accuracy": summary["initial_accuracy"],
                                  "generated_tokens": summary["generated_tokens"], "step_metrics": steps,
                                  "correct": evals[-1], "trace": trace})
    return runs


def tokens_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """Generated tokens at the first eval with accuracy >= ``target`` (None: never).

    >>> tokens_to_reach([(0, .4), (100, .6), (200, .7)], .6)
    100
    """
    return next((t for t, acc in curve if acc >= target - 1e-12), None)


def zero_signal_share(step_metrics: list[dict]) -> float:
    """Trained groups with zero signal over all steps / trained groups."""
    zero = sum(m["groups/zero_signal"] * m["groups/trained"] for m in step_metrics)
    return zero / max(sum(m["groups/trained"] for m in step_metrics), 1)


def tokens_per_trained_rollout(step_metrics: list[dict]) -> float:
    """Tokens the engine sampled (every round, pruned rollouts included) per rollout the update trained on."""
    return sum(m.get("tokens/generated", 0.0) for m in step_metrics) / max(
        sum(m.get("rollouts/trained", 0.0) for m in step_metrics), 1)


def effect_against(rs: list[dict], base: dict[int, dict]) -> dict:
    """The paired effect of an arm's runs against the baseline's (``{seed: run}``, runs with ``correct``),
    and the first step its runs depart from the baseline's (earliest over seeds; None: never)."""
    seeds = [r["seed"] for r in rs if r["seed"] in base]
    mine = {r["seed"]: r for r in rs}
    if not seeds or not all("correct" in mine[s] and "correct" in base[s] for s in seeds):
        return {}
    e = paired_effect({s: mine[s]["correct"] for s in seeds}, {s: base[s]["correct"] for s in seeds})
    departs = [departure_step(mine[s]["trace"], base[s]["trace"]) for s in seeds if "trace" in mine[s]]
    return {k: v for k, v in e.as_dict().items() if k not in ("seeds",)} | {
        "departs_at": min((d for d in departs if d is not None), default=None)}


def summarize(runs: dict[str, list[dict]], arms: list[str]) -> dict[str, dict]:
    """Per arm: accuracy mean/spread, the paired effect against ``none`` (``effect_against``),
    tokens-to-baseline ratio, zero-signal share, wall, controller metrics."""
    base = {r["seed"]: r for r in runs.get("none", [])}
    table = {}
    for arm in arms:
        rs = runs[arm]
        acc = [r["final_accuracy"] for r in rs]
        ratios = []
        for r in rs:
            b = base.get(r["seed"])
            if b is None:
                continue
            target = b["final_accuracy"]
            mine, theirs = tokens_to_reach(r["curve"], target), tokens_to_reach(b["curve"], target)
            if mine is not None and theirs:
                ratios.append(mine / theirs)
        keys = sorted({k for r in rs for m in r["step_metrics"] for k in m if k.startswith(("control/", "arrol/"))})
        control = {k: statistics.mean(m[k] for r in rs for m in r["step_metrics"] if k in m) for k in keys}
        table[arm] = {
            "accuracy_mean": statistics.mean(acc), "accuracy_spread": max(acc) - min(acc), "accuracies": acc,
            "initial_accuracy": rs[0]["initial_accuracy"],
            "tokens_ratio": statistics.mean(ratios) if ratios else None, "reached": len(ratios), "seeds": len(rs),
            "zero_signal_share": statistics.mean(zero_signal_share(r["step_metrics"]) for r in rs),
            "wall_seconds": statistics.mean(r["wall_seconds"] for r in rs),
            "steps": statistics.mean(r["steps"] for r in rs), "control": control,
            "tokens_per_trained_rollout": statistics.mean(tokens_per_trained_rollout(r["step_metrics"]) for r in rs),
        } | ({} if arm == "none" else effect_against(rs, base))
    return table


def _print(console, cfg: ControlBenchConfig, task: str, table: dict) -> None:
    first = next(iter(table.values()))
    tokens = cfg.tokens if task == "arith" else cfg.countdown_tokens
    t = Table(title=f"{task}: GRPO at {tokens:,} generated tokens per run, {len(cfg.seeds)} seeds, greedy accuracy "
                    f"on {cfg.eval_size} held-out prompts (warm start {first['initial_accuracy']:.1%}); Δ paired by "
                    "seed and prompt, 95% t interval over seeds")
    for col in ("arm", "accuracy", "Δ vs none [95% CI]", "verdict", "departs at step", "tokens to baseline's final",
                "zero-signal groups", "tokens/trained rollout", "steps", "wall s"):
        t.add_column(col, justify="left" if col in ("arm", "verdict") else "right")
    for arm, row in table.items():
        ratio = "—" if row["tokens_ratio"] is None else f"{row['tokens_ratio']:.2f}x ({row['reached']}/{row['seeds']})"
        departs = "—" if "difference" not in row else ("never" if row["departs_at"] is None else str(row["departs_at"]))
        t.add_row(arm, f"{row['accuracy_mean']:.1%}", delta(row), row.get("verdict", "—"), departs, ratio,
                  f"{row['zero_signal_share']:.1%}", f"{row['tokens_per_trained_rollout']:.1f}", f"{row['steps']:.0f}",
                  f"{row['wall_seconds']:.0f}")
    console.print(t)
    for arm, row in table.items():
        if row["control"]:
            console.print(f"  {arm}: " + ", ".join(f"{k.split('/', 1)[1]} {v:.3g}" for k, v in row["control"].items()),
                          highlight=False, soft_wrap=True)
