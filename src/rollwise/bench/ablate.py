"""``rollwise bench ablate``: the ablation ledger — every method id against the ``grpo``/``group`` baseline.

An arm is ``<stage>:<id>`` — ``objective:<preset>``, ``strategy:<id>``, ``control:<id>``,
``replay:<id>`` — and changes exactly one config line of the baseline (GRPO, independent
group sampling, no control, no replay). Default arms: every method id implemented
(``default_arms()``). For each task (``arith``, ``countdown``) one SFT warm start is shared by
every arm; each arm runs for every seed until the engine has sampled the task's token budget,
evaluating greedy accuracy every ``eval_every`` steps and at the end.

Resumable: every finished run is appended to ``OUT/results.jsonl`` and the warm starts stay in
``OUT/warm_<task>``; a killed ablation started again with the same ``out`` skips what is done.
An arm whose config is refused (a ConfigError: a combination that makes no sense) is recorded
as refused with the reason, not run.

Per arm and task (``summarize``): accuracy at the budget (mean over seeds); the difference
from the baseline, paired by seed, with a 95% bootstrap confidence interval over seeds
(10,000 resamples, a fixed generator); generated tokens to the baseline's final accuracy (the
control bench's ratio); wall time; and a verdict — "better" when the interval lies above 0,
"worse" when below, else "no detectable difference" (with 3 seeds an interval is wide: that
answer is expected and honest). Written as ``ledger.json``, ``ledger.md`` and ``ledger.html``.
"""

from __future__ import annotations

import html
import json
import statistics
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from rollwise.bench.control import task_sets, tokens_to_reach, warm_start
from rollwise.bench.engine import _quiet_transformers
from rollwise.config import ConfigError, StrictModel, apply_overrides, validate
from rollwise.report.runs import read_jsonl

BASELINE = "baseline"
STAGE_KEYS = {"objective": "objective.method", "strategy": "rollout.strategy", "control": "control.method",
              "replay": "replay.method"}
# what an arm needs besides its one line (method-specific requirements)
ARM_EXTRAS = {"objective:mc_grpo": ["rollout.num_generations=7"]}


def default_arms() -> list[str]:
    """Every implemented method id, as ``stage:id`` (baselines and aliases left out)."""
    from rollwise.control import CONTROLLERS
    from rollwise.generate import STRATEGIES
    from rollwise.optim.objective import PRESETS
    from rollwise.replay import REPLAY_METHODS

    seen, objectives = set(), []
    for name, preset in PRESETS.items():  # aliases (dapo_clip_higher = dapo) once
        if name != "grpo" and id(preset) not in seen:
            seen.add(id(preset))
            objectives.append(name)
    return ([f"objective:{n}" for n in objectives] + [f"strategy:{n}" for n in STRATEGIES if n != "group"]
            + [f"control:{n}" for n in CONTROLLERS if n != "none"]
            + [f"replay:{n}" for n in REPLAY_METHODS if n != "none"])


class AblateBenchConfig(StrictModel):
    """Settings of ``rollwise bench ablate`` (override with ``--set key=value``)."""

    arms: list[str] | None = Field(None, description="arms as stage:id (null = every implemented method id)")
    tasks: list[Literal["arith", "countdown"]] = Field(["arith", "countdown"], min_length=1, description="tasks")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="RL seeds per arm")
    out: str = Field("runs/ablate", description="results directory (results.jsonl, warm starts, the ledger): "
                     "run again with the same out to continue a killed ablation")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default)")
    preset: str = Field("tiny", description="model preset (random init, then SFT)")
    sft_steps: int = Field(500, ge=0, description="SFT warm-start steps per task")
    tokens: int = Field(60_000, ge=1, description="arith: generated-token budget of every run")
    countdown_tokens: int = Field(60_000, ge=1, description="countdown: generated-token budget of every run")
    num_generations: int = Field(8, ge=2, description="rollouts per prompt")
    prompts_per_step: int = Field(16, ge=1, description="groups per step")
    lr: float = Field(3e-5, gt=0, description="learning rate")
    eval_every: int = Field(5, ge=1, description="evaluate every N steps (and at the end)")
    eval_size: int = Field(200, ge=1, description="held-out prompts for greedy accuracy")
    arith_max_digits: int = Field(5, ge=1, description="arith: operand digits up to this")
    arith_max_new_tokens: int = Field(96, ge=1, description="arith completion limit")
    countdown_max_new_tokens: int = Field(32, ge=1, description="countdown completion limit")
    countdown_max_numbers: int = Field(3, ge=3, le=6, description="countdown: most numbers given per prompt")


def load_ablate_config(overrides: list[str]) -> AblateBenchConfig:
    cfg = validate(AblateBenchConfig, apply_overrides({}, list(overrides)))
    for arm in cfg.arms or []:
        stage, _, name = arm.partition(":")
        if stage not in STAGE_KEYS or not name:
            raise ConfigError(f"arms: {arm!r} is not stage:id; stages are {', '.join(STAGE_KEYS)} "
                              "(e.g. objective:dapo, control:vade)")
    return cfg


def arm_lines(arm: str) -> list[str]:
    """The config lines an arm changes from the baseline."""
    if arm == BASELINE:
        return []
    stage, _, name = arm.partition(":")
    return [f"{STAGE_KEYS[stage]}={name}", *ARM_EXTRAS.get(arm, [])]


def run_ablate_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_ablate_config(overrides)
    arms = [BASELINE, *(cfg.arms if cfg.arms is not None else default_arms())]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    finished = read_jsonl(results_path)  # a line cut by a kill is dropped
    if results_path.exists():  # drop a line cut by a kill before appending again
        results_path.write_text("".join(json.dumps(r) + "\n" for r in finished))
    done = {(r["task"], r["arm"], r["seed"]): r for r in finished}
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        with _quiet_transformers(), torch.random.fork_rng():
            for task in cfg.tasks:
                warm = _warm_start(cfg, task, out, console)
                for seed in cfg.seeds:
                    for arm in arms:
                        if (task, arm, seed) in done:
                            continue
                        record = _run(cfg, task, arm, seed, warm, out, console)
                        with results_path.open("a") as f:
                            f.write(json.dumps(record) + "\n")
                        done[(task, arm, seed)] = record
    finally:
        torch.set_num_threads(threads)
    ledger = {"settings": cfg.model_dump(), "command": "rollwise bench ablate " + " ".join(
        f"--set {o}" for o in overrides), "tasks": {}}
    for task in cfg.tasks:
        runs = [r for (t, _, _), r in done.items() if t == task]
        ledger["tasks"][task] = summarize(runs, arms)
    write_ledger(ledger, out)
    if json_path is not None:
        json_path.write_text(json.dumps(ledger, indent=2))
    console.print(to_markdown(ledger), highlight=False, soft_wrap=True)
    return ledger


def _warm_start(cfg: AblateBenchConfig, task: str, out: Path, console) -> Path:
    model_dir = out / f"warm_{task}" / "init_model"
    if (model_dir / "config.json").exists():  # a resumed ablation keeps its warm start
        return model_dir
    return warm_start(cfg, task, out, console)


def _run(cfg: AblateBenchConfig, task: str, arm: str, seed: int, warm: Path, out: Path, console) -> dict:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer, Until

    tokens = cfg.tokens if task == "arith" else cfg.countdown_tokens
    record = {"task": task, "arm": arm, "seed": seed, "lines": arm_lines(arm)}
    sets = [f"output_dir={out / 'runs'}", f"name={task}_{arm.replace(':', '_')}_{seed}", f"seed={seed}",
            f"model.path={warm}", f"model.threads={torch.get_num_threads()}", *task_sets(cfg, task), "sft.steps=0",
            f"rollout.num_generations={cfg.num_generations}", f"rollout.prompts_per_step={cfg.prompts_per_step}",
            f"optim.lr={cfg.lr}", "optim.micro_batch_size=128", "train.steps=100000",
            f"train.eval_every={cfg.eval_every}", "train.eval_samples=0", "train.log_samples=0",
            "train.checkpoint_every=0", *arm_lines(arm)]
    curve = []
    start = time.perf_counter()
    try:
        with console.status(f"{task}: {arm}, seed {seed}") as status, Trainer(load_run_config(None, sets)) as t:
            t.prepare()
            summary = t.fit(Until(generated_tokens=tokens),
                            on_eval=lambda step, r: curve.append((t.state.generated_tokens, r.accuracy)),
                            on_step=lambda step, m: status.update(
                                f"{task}: {arm}, seed {seed}, {t.state.generated_tokens:,}/{tokens:,} tokens"))
    except ConfigError as e:
        return record | {"refused": str(e)}
    return record | {"curve": curve, "final_accuracy": summary["final_accuracy"],
                     "initial_accuracy": summary["initial_accuracy"], "generated_tokens": summary["generated_tokens"],
                     "steps": summary["steps"], "wall_seconds": time.perf_counter() - start}


def bootstrap_ci(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of ``diffs`` over resamples with replacement.

    >>> bootstrap_ci([0.1, 0.1, 0.1])
    (0.1, 0.1)
    """
    d = np.asarray(diffs, dtype=np.float64)
    means = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return round(float(lo), 12), round(float(hi), 12)


def verdict(lo: float, hi: float) -> str:
    if lo > 0:
        return "better"
    if hi < 0:
        return "worse"
    return "no detectable difference"


def summarize(runs: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: accuracy at the budget, paired difference from the baseline with its 95% bootstrap
    interval and verdict, tokens to the baseline's final accuracy, wall time (or the refusal)."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    base = by_arm.get(BASELINE, {})
    table = {}
    for arm in arms:
        rs = by_arm.get(arm, {})
        if not rs:
            continue
        refused = next((r["refused"] for r in rs.values() if "refused" in r), None)
        if refused is not None:
            table[arm] = {"lines": arm_lines(arm), "refused": refused}
            continue
        seeds = sorted(s for s in rs if s in base and "refused" not in base[s])
        acc = [rs[s]["final_accuracy"] for s in sorted(rs)]
        diffs = [rs[s]["final_accuracy"] - base[s]["final_accuracy"] for s in seeds]
        ratios = []
        for s in seeds:
            target = base[s]["final_accuracy"]
            mine, theirs = tokens_to_reach(rs[s]["curve"], target), tokens_to_reach(base[s]["curve"], target)
            if mine is not None and theirs:
                ratios.append(mine / theirs)
        row = {"lines": arm_lines(arm), "seeds": len(rs), "accuracy_mean": statistics.mean(acc), "accuracies": acc,
               "wall_seconds": statistics.mean(r["wall_seconds"] for r in rs.values()),
               "tokens_ratio": statistics.mean(ratios) if ratios else None, "reached": len(ratios)}
        if diffs:
            lo, hi = bootstrap_ci(diffs)
            row |= {"difference": statistics.mean(diffs), "ci95": [lo, hi],
                    "verdict": "baseline" if arm == BASELINE else verdict(lo, hi)}
        table[arm] = row
    return table


def _delta(row: dict) -> str:
    """Δ vs the baseline in points with its interval, as the ledgers print it."""
    if "difference" not in row:
        return "—"
    lo, hi = row["ci95"]
    return f"{row['difference'] * 100:+.1f} [{lo * 100:+.1f}, {hi * 100:+.1f}]"


def _ratio(row: dict) -> str:
    return "—" if row["tokens_ratio"] is None else f"{row['tokens_ratio']:.2f}×"


def to_markdown(ledger: dict) -> str:
    lines = [f"Command: `{ledger['command']}`", ""]
    for task, table in ledger["tasks"].items():
        lines += [f"### {task}", "", "| arm | config line | accuracy | Δ vs baseline [95% CI] | tokens to baseline's "
                  "final | wall s | verdict |", "|---|---|---|---|---|---|---|"]
        for arm, row in table.items():
            line = ", ".join(f"`{x}`" for x in row["lines"]) or "—"
            if "refused" in row:
                lines.append(f"| {arm} | {line} | — | — | — | — | refused: {row['refused']} |")
                continue
            ratio = _ratio(row) + ("" if row["tokens_ratio"] is None else f" ({row['reached']}/{row['seeds']})")
            lines.append(f"| {arm} | {line} | {row['accuracy_mean']:.1%} | {_delta(row)} | {ratio} | "
                         f"{row['wall_seconds']:.0f} | {row.get('verdict', '—')} |")
        lines.append("")
    return "\n".join(lines)


def write_ledger(ledger: dict, out: Path) -> None:
    (out / "ledger.json").write_text(json.dumps(ledger, indent=2))
    md = to_markdown(ledger)
    (out / "ledger.md").write_text(md + "\n")
    rows = []
    for task, table in ledger["tasks"].items():
        rows.append(f"<h2>{html.escape(task)}</h2><table><tr><th>arm</th><th>accuracy</th><th>Δ [95% CI]</th>"
                    "<th>tokens to baseline's final</th><th>wall s</th><th>verdict</th></tr>")
        for arm, row in table.items():
            if "refused" in row:
                cells = [arm, "—", "—", "—", "—", "refused: " + row["refused"]]
            else:
                cells = [arm, f"{row['accuracy_mean']:.1%}", _delta(row), _ratio(row), f"{row['wall_seconds']:.0f}",
                         row.get("verdict", "—")]
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        rows.append("</table>")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>rollwise ablation ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px}</style></head><body><h1>Ablation ledger</h1><p>" + html.escape(ledger["command"])
            + "</p>" + "".join(rows) + "</body></html>")
    (out / "ledger.html").write_text(page)
