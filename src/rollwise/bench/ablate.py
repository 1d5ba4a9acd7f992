"""``rollwise bench ablate``: the ablation ledger — every method id against the ``grpo``/``group`` baseline.

Arms — ``<stage>:<id>``, at a regime (``@epochs2``), joined (``+``), at a setting (``set:k=v``), the
baseline and its noise floor — are written in ``rollwise.bench.arms``'s grammar.

For each task (``arith``, ``countdown``) one SFT warm start is shared by every arm (with ``recipe``:
a run config's own model, task and settings instead — a real model from its pretrained weights,
``recipe_tokens`` per run; the ledger's task is the recipe's file name); each arm
runs for every seed until the engine has sampled the task's token budget, evaluating greedy
accuracy every ``eval_every`` steps and at the end; each run keeps its final eval's correctness
per prompt, every eval's, and its per-step trace (tokens sampled, mean reward).

Resumable: every finished run is appended to ``OUT/results.jsonl`` and the warm starts stay in
``OUT/warm_<task>``; the eval of a start is computed once and kept in ``OUT/eval_cache``
(``train.eval_cache``: every run from one start reads it); a killed ablation started again with the
same ``out`` skips what is done (``checkpoint_every``: a killed run itself resumes from its last
checkpoint; one whose checkpoint the settings now contradict stops the ablation, ``ResumeRefused``). ``shard=i/n`` splits
the runs over n processes sharing ``out`` (each appends to its own ``results.<i>.jsonl`` and reads
every file; with the tiny tasks, let one make the warm starts first); a final run without a shard
finds everything done and writes the ledger; ``run=false`` writes the ledger of what is finished so
far without training anything (an interim look while shards run). ``keep_runs``: a directory to commit
beside the code, each finished run's record one file in it (``<run>.json``), read as finished too — the
ledger then survives what ``out`` does not (a fresh checkout, another machine): only begun runs restart.
Each record names the weights its run began from (``start``: a digest), and the ledger warns when its
runs began from different ones (a warm start rebuilt elsewhere that came out otherwise).
An arm whose config is refused (a ConfigError: a combination that makes no sense) is recorded
as refused with the reason, not run.

Per arm and task the ledger (``rollwise.bench.ledger.summarize``) holds accuracy at the budget,
the paired effect against its baseline with its Holm-adjusted p, where its runs depart from the
baseline's, tokens to the baseline's final accuracy, its accuracy curve, its zero-signal share and
what its controller did; written as ``ledger.json``, ``ledger.md``, ``ledger.html`` and ``curves.png``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.arms import BASELINE, REGIMES, arm_lines, baseline_of, check_arm, default_arms, split_arm
from rollwise.bench.compare import metric_means, zero_signal_share
from rollwise.bench.harness import (NOISE_FLOOR, TaskBenchConfig, computed_on, history, load_settings, rl_sets,
                                    run_sets, seed_sets, session, task_sets, task_warm_start, threads_set, train_run,
                                    write_json)
from rollwise.bench.ledger import machines, sections, summarize, write_ledger
from rollwise.bench.reading import read_table
from rollwise.config import ConfigError
from rollwise.report.runs import read_jsonl
from rollwise.train.config import load_run_config
from rollwise.train.resume import ResumeRefused

# the step metrics a run keeps: its share of trained groups without reward spread (the regime's measure)
# and what its controller did (rounds, refills, picked pass rates: the method acted, and how much)
KEEP = ("groups/zero_signal", "groups/trained", "control/", "arrol/")


class AblateBenchConfig(TaskBenchConfig):
    """Settings of ``rollwise bench ablate`` (override with ``--set key=value``)."""

    arms: list[str] | None = Field(None, description="arms as stage:id or stage:id@regime (null = every implemented "
                                   "method id, and the ratio presets in each of `regimes`)")
    regimes: list[Literal[tuple(REGIMES)]] = Field(["epochs2", "async1"], description="off-policy regimes the default "
                                                   "arms measure the ratio presets in")
    out: str = Field("runs/ablate", description="results directory (results.jsonl, warm starts, the ledger): "
                     "run again with the same out to continue a killed ablation")
    tokens: int = Field(240_000, ge=1, description="arith: generated-token budget of every run (~46 baseline steps)")
    countdown_tokens: int = Field(160_000, ge=1, description="countdown: generated-token budget of every run "
                                  "(~120 baseline steps)")
    eval_every: int = Field(5, ge=1, description="evaluate every N steps (and at the end)")
    recipe: str | None = Field(None, description="a run config (YAML) to measure the arms on instead of `tasks`: its "
                               "model from its own weights (no SFT warm start), task and settings (`preset`, "
                               "`sft_steps`, `num_generations`, `prompts_per_step`, `lr` unused)")
    recipe_tokens: int = Field(10_000, ge=1, description="with `recipe`: generated-token budget of every run")
    shard: str | None = Field(None, pattern=r"^\d+/\d+$", description="i/n: run only every n-th (seed, arm) run "
                              "starting at the i-th, into results.<i>.jsonl — n processes with the same `out` share "
                              "the ledger (each reads all results files); a last run without a shard writes it")
    checkpoint_every: int = Field(0, ge=0, description="checkpoint every run every N steps, and resume a killed run "
                                  "from its last checkpoint (0: a killed run starts again; for long runs)")
    look: int | None = Field(None, ge=1, description="the ledger states its reading (what its rows allow one to "
                             "claim: rollwise.bench.reading) only once every arm has this many seeds; default: every "
                             "seed in `seeds`")
    keep_runs: str | None = Field(None, description="a directory (commit it) where every finished run's record is "
                                  "also written, one <run>.json each, and read back as finished: the ledger "
                                  "continues from a fresh checkout or another machine (e.g. docs/data/ledger-runs)")
    run: bool = Field(True, description="false: train nothing, write the ledger of the runs finished so far (an "
                      "interim ledger while shards still run; an arm without runs has no row)")

    def budget(self, task: str) -> int:
        return self.recipe_tokens if self.recipe else super().budget(task)

    def task_names(self) -> list[str]:
        """The ledger's tasks: ``tasks``, or the recipe's file name."""
        return [Path(self.recipe).stem] if self.recipe else list(self.tasks)


def load_ablate_config(overrides: list[str]) -> AblateBenchConfig:
    cfg = load_settings(AblateBenchConfig, overrides)
    for arm in cfg.arms or []:
        check_arm(arm)
    if cfg.recipe is not None and not Path(cfg.recipe).is_file():
        raise ConfigError(f"recipe: no file {cfg.recipe!r}; give a run config's path (e.g. recipes/smollm2_add.yaml)")
    return cfg


def all_arms(cfg: AblateBenchConfig) -> list[str]:
    """The baseline, the noise floor, the arms, and a baseline for each regime an arm uses (before its arms)."""
    arms = [BASELINE, *([NOISE_FLOOR] if cfg.noise_floor else [])]
    for arm in cfg.arms if cfg.arms is not None else default_arms(cfg.regimes):
        base = baseline_of(arm)
        if base not in arms:
            arms.append(base)
        if arm not in arms:
            arms.append(arm)
    return arms


def results_file(out: Path, shard: str | None) -> Path:
    """Where this process appends its runs: ``results.jsonl``, or ``results.<i>.jsonl`` for shard ``i/n``."""
    return out / ("results.jsonl" if shard is None else f"results.{shard.split('/')[0]}.jsonl")


def read_results(out: Path, mine: Path, kept: Path | None = None) -> list[dict]:
    """Every finished run in ``out`` (every shard's file) and in ``kept`` (``keep_runs``); ``mine`` is
    rewritten without a line cut by a kill (the other shards' files belong to their processes)."""
    finished = []
    for path in sorted(out.glob("results*.jsonl")):
        records = read_jsonl(path)
        if path == mine:
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        finished += [with_step_summary(r, out) for r in records]
    if kept is not None:
        finished += [json.loads(path.read_text()) for path in sorted(kept.glob("*.json"))]
    return finished


def keep_run(kept: Path, record: dict) -> None:
    """Write a finished run's record into ``keep_runs`` as ``<run>.json`` (whole or not at all)."""
    kept.mkdir(parents=True, exist_ok=True)
    path = kept / f"{run_name(record['task'], record['arm'], record['seed'])}.json"
    part = path.with_suffix(".part")
    part.write_text(json.dumps(record) + "\n")
    part.replace(path)


@functools.lru_cache
def start_digest(path: Path) -> str | None:
    """A digest of the weights a run begins from (its model directory's ``*.safetensors``; None for
    anything else, e.g. a packaged GGUF): runs that began from other weights are not one ledger.
    Read once per process: every run of an ablation begins from the start it built before them."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def my_runs(pending: list[tuple[str, int, str]], shard: str | None) -> list[tuple[str, int, str]]:
    """The (task, seed, arm) runs this process takes: all, or shard ``i/n``'s every n-th from the i-th.

    >>> my_runs([("t", 0, "a"), ("t", 0, "b"), ("t", 1, "a")], "1/2")
    [('t', 0, 'b')]
    """
    if shard is None:
        return pending
    i, n = map(int, shard.split("/"))
    return pending[i::n]


def run_ablate_bench(overrides: list[str], console, json_path: Path | None = None) -> dict:
    cfg = load_ablate_config(overrides)
    arms, out, tasks = all_arms(cfg), Path(cfg.out), cfg.task_names()
    out.mkdir(parents=True, exist_ok=True)
    results_path, kept = results_file(out, cfg.shard), cfg.keep_runs and Path(cfg.keep_runs)
    done = {(r["task"], r["arm"], r["seed"]): r for r in read_results(out, results_path, kept)}
    everything = [(t, s, a) for t in tasks for s in cfg.seeds for a in arms]
    with session(cfg.threads):
        for task in tasks:
            warm = out / f"warm_{task}" / "init_model"
            if not cfg.run:
                break
            if cfg.recipe is None and not (warm / "config.json").exists():  # a resumed ablation keeps its warm start
                warm = task_warm_start(cfg, task, out, console)
            for t, seed, arm in my_runs(everything, cfg.shard):
                if t != task or (task, arm, seed) in done:
                    continue
                done[(task, arm, seed)] = record = _run(cfg, task, arm, seed, warm, out, console)
                with results_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                if kept:
                    keep_run(kept, record)
    done |= {(r["task"], r["arm"], r["seed"]): r for r in read_results(out, results_path, kept)}  # other shards'
    ledger = {"settings": cfg.model_dump(), "command": "rollwise bench ablate " + " ".join(
        f"--set {o}" for o in overrides), "progress": progress(everything, done, out, cfg.budget), "tasks": {}}
    runs = {task: [r for (t, _, s), r in done.items() if t == task and s in cfg.seeds] for task in tasks}
    for task in tasks:
        ledger["tasks"][task] = summarize(runs[task], arms)
    ledger["computed_on"] = {task: machines(runs[task]) for task in tasks}
    look = cfg.look or len(cfg.seeds)
    ledger["reading"] = {task: {regime or "": read_table(dict(rows), look) for regime, rows in sections(table)}
                         for task, table in ledger["tasks"].items()}
    markdown = write_ledger(ledger, out, runs)
    write_json(json_path, ledger)
    console.print(markdown, highlight=False, soft_wrap=True, markup=False)  # arms=[...] is not a rich tag
    return ledger


def progress(everything: list[tuple[str, int, str]], done: dict, out: Path, budget) -> dict:
    """How far the ledger is: runs finished of all it plans, and each unfinished run that has begun
    (its run directory's last step and generated tokens against ``budget(task)``)."""
    begun = []
    for task, seed, arm in everything:
        if (task, arm, seed) in done:
            continue
        rows = read_jsonl(out / "runs" / run_name(task, arm, seed) / "metrics.jsonl")
        steps = [r for r in rows if "tokens/total" in r]
        if steps:
            begun.append({"task": task, "arm": arm, "seed": seed, "step": steps[-1]["step"],
                          "tokens": int(steps[-1]["tokens/total"]), "budget": budget(task)})
    walls = [done[t, a, s]["wall_seconds"] for t, s, a in everything
             if (t, a, s) in done and "wall_seconds" in done[t, a, s]]
    return {"finished": sum((t, a, s) in done for t, s, a in everything), "planned": len(everything), "begun": begun,
            "mean_run_seconds": sum(walls) / len(walls) if walls else None}


def _run(cfg: AblateBenchConfig, task: str, arm: str, seed: int, warm: Path, out: Path, console) -> dict:
    """One arm on one seed to the task's token budget (a refused config: recorded as refused)."""
    record = {"task": task, "arm": arm, "seed": seed, "lines": arm_lines(arm)}
    lines = [x for x in arm_lines(arm) if not x.startswith("sampling_seed=")]
    if "train.mode=async" in lines:
        lines += [f"train.generation_threads={torch.get_num_threads()}",
                  f"train.update_threads={torch.get_num_threads()}"]
    name = run_name(task, arm, seed)
    if cfg.recipe is None:
        common = [*rl_sets(cfg, out / "runs", name, seed, warm, cfg.eval_every), *task_sets(cfg, task)]
    else:  # the recipe's model, task and settings
        common = run_sets(out / "runs", name, seed, cfg.eval_every)
    sets = [*common, threads_set(), f"train.eval_cache={out / 'eval_cache'}",  # every run's start: evaluated once
            *lines, *seed_sets(split_arm(arm)[0], seed)]
    try:
        run = train_run(sets, console, f"{task}: {arm}, seed {seed}", tokens=cfg.budget(task), recipe=cfg.recipe,
                        checkpoint_every=cfg.checkpoint_every, keep=KEEP)
    except ResumeRefused:  # a begun run's checkpoint and these settings disagree: not the arm's refusal; stop
        raise
    except ConfigError as e:
        return record | {"refused": str(e)}
    start = warm if cfg.recipe is None else load_run_config(cfg.recipe, []).model.path  # None: a preset's
    return record | run.record(seed) | {
        "start": start and start_digest(Path(start)), "curve": run.curve, "correct": run.evals[-1]["correct"],
        "eval_correct": [e["correct"] for e in run.evals],
        "steps": run.summary["steps"]} | step_summary(run.steps)


def step_summary(steps: list[dict]) -> dict:
    """What a run's kept step metrics say: its zero-signal share and its controller's mean metrics."""
    return {"zero_signal_share": zero_signal_share(steps), "control": metric_means(steps)}


def run_name(task: str, arm: str, seed: int) -> str:
    """The run directory's name under ``out/runs``."""
    return f"{task}_{re.sub(r'[^A-Za-z0-9_.-]', '_', arm)}_{seed}"


def with_step_summary(record: dict, out: Path) -> dict:
    """A record written before runs kept their step summary or where they computed: read back from the
    run's directory when it is still there (else the record as it is)."""
    run_dir = out / "runs" / run_name(record["task"], record["arm"], record["seed"])
    if "refused" in record:
        return record
    if "computed_on" not in record and (run_dir / "summary.json").exists():
        record = record | {"computed_on": computed_on(json.loads((run_dir / "summary.json").read_text()))}
    if "control" in record or not (run_dir / "metrics.jsonl").exists():
        return record
    steps = history(run_dir, KEEP)[2]
    return record | step_summary(steps) if steps else record


