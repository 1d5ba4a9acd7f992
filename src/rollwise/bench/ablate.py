"""``rollwise bench ablate``: the ablation ledger — every method id against the ``grpo``/``group`` baseline.

An arm is ``<stage>:<id>`` — ``objective:<preset>``, ``strategy:<id>``, ``control:<id>``,
``replay:<id>``, ``reward:<id>`` (``rewards=[{name: <id>}]``) — and changes exactly one config
line of the baseline (GRPO, independent group sampling, no control, no replay, the task's reward). ``<stage>:<id>@<regime>`` measures it in an off-policy
regime (``REGIMES``: ``epochs2`` = two optimizer passes per batch, ``async1`` = async with
staleness 1, ``replay`` = rollout replay) against the baseline in that regime
(``baseline@<regime>``); ``regime:<regime>`` is the regime itself (the baseline there) against the
baseline (e.g. ``regime:async1``: what going async costs). Arms join with ``+`` into one arm
(``objective:dapo+control:vade``); ``set:<key>=<value>`` joins any other config line, for an arm at a
setting its paper recommends (``control:xrpo_alloc+set:control.xrpo_alloc.bonus=0.1``). Default arms (``default_arms()``): every method id implemented, plus,
in each of ``regimes``, every objective preset that differs from GRPO only in fields that act
through the importance ratio (``ratio_presets()``: at one optimizer pass, on fresh samples, the
ratio is 1 and those fields do nothing). The ``noise_floor`` arm is the baseline again with other
rollout-sampling seeds (``sampling_seed``; same warm start, data order and eval set).

For each task (``arith``, ``countdown``) one SFT warm start is shared by every arm (with ``recipe``:
a run config's own model, task and settings instead — a real model from its pretrained weights,
``recipe_tokens`` per run; the ledger's task is the recipe's file name); each arm
runs for every seed until the engine has sampled the task's token budget, evaluating greedy
accuracy every ``eval_every`` steps and at the end; each run keeps its final eval's correctness
per prompt, every eval's, and its per-step trace (tokens sampled, mean reward).

Resumable: every finished run is appended to ``OUT/results.jsonl`` and the warm starts stay in
``OUT/warm_<task>``; the eval of a start is computed once and kept in ``OUT/eval_cache``
(``train.eval_cache``: every run from one start reads it); a killed ablation started again with the same ``out`` skips what is done
(``checkpoint_every``: a killed run itself resumes from its last checkpoint). ``shard=i/n`` splits
the runs over n processes sharing ``out`` (each appends to its own ``results.<i>.jsonl`` and reads
every file; with the tiny tasks, let one make the warm starts first); a final run without a shard
finds everything done and writes the ledger; ``run=false`` writes the ledger of what is finished so
far without training anything (an interim look while shards run).
An arm whose config is refused (a ConfigError: a combination that makes no sense) is recorded
as refused with the reason, not run.

Per arm and task (``summarize``): accuracy at the budget (mean over seeds); the effect against
its baseline, paired by seed and prompt, with its 95% t interval over seeds, p and verdict
(``rollwise.bench.stats``); the first step at which its runs depart from the baseline's
(``departs_at``: earliest over seeds; None = identical for the whole budget); generated tokens
to the baseline's final accuracy (the control bench's ratio); wall time. Arms whose runs are
identical on every seed — per-step trace and every eval's per-prompt correctness — are one
computation at these settings and are reported once, with every id (``ids``). Written as
``ledger.json``, ``ledger.md`` and ``ledger.html`` (``rollwise.bench.ledger``).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.harness import (NOISE_FLOOR, NOISE_SEED_OFFSET, TaskBenchConfig, departs_at, history,
                                    load_settings, metric_means, paired, rl_sets, run_sets, seed_sets, session,
                                    task_sets, task_warm_start, threads_set, tokens_ratios, train_run, write_json,
                                    zero_signal_share)
from rollwise.bench.ledger import mean_curve, write_ledger
from rollwise.bench.stats import add_holm, identical_groups, seed_test, verdict
from rollwise.config import ConfigError
from rollwise.report.runs import read_jsonl

BASELINE = "baseline"
STAGE_KEYS = {"objective": "objective.method", "strategy": "rollout.strategy", "control": "control.method",
              "replay": "replay.method", "reward": "rewards"}  # reward:<name> = rewards=[{name: <name>}]
# reward ids measured as arms (the task's verifier replaced; a task the reward does not score refuses the arm)
REWARD_ARMS = ("fapo", "majority_vote", "pow3r", "weaver")
# what an arm needs besides its one line (method-specific requirements)
ARM_EXTRAS = {"objective:mc_grpo": ["rollout.num_generations=7"],
              # BroRL: the baseline's rollouts per step as one group of N = 128 (the bench sets G and prompts)
              "strategy:brorl": ["rollout.num_generations=128", "rollout.prompts_per_step=1",
                                 "optim.micro_batch_size=16"],
              "reward:majority_vote": ["task.labels=none"]}  # label-free: training never sees the answers
# the step metrics a run keeps: its share of trained groups without reward spread (the regime's measure)
# and what its controller did (rounds, refills, picked pass rates: the method acted, and how much)
KEEP = ("groups/zero_signal", "groups/trained", "control/", "arrol/")
# off-policy regimes: where the ratio pi_theta / pi_old departs from 1 (async also sets its threads, in _run)
REGIMES = {"epochs2": ["optim.num_iterations=2"], "async1": ["train.mode=async", "train.max_staleness=1"],
           "replay": ["replay.method=rollout_replay"]}
# ObjectiveConfig fields that act only through the importance ratio: inert at ratio 1
RATIO_FIELDS = ("policy_loss", "importance_sampling_level", "epsilon", "epsilon_high", "dual_clip", "sapo_tau_pos",
                "sapo_tau_neg", "prefix_ratio", "tis_mode", "tis_cap", "tis_cap_min", "vcpo",
                "old_logit_repair")


def distinct_presets() -> list[str]:
    """Objective preset ids but ``grpo``, each preset once (an alias such as dapo_clip_higher = dapo: its first id)."""
    from rollwise.optim.objective import PRESETS

    seen: dict[int, str] = {}
    for name, preset in PRESETS.items():
        if name != "grpo":
            seen.setdefault(id(preset), name)
    return list(seen.values())


def ratio_presets() -> list[str]:
    """Objective presets that differ from GRPO's resolved config in a ratio-only field (``RATIO_FIELDS``):
    the ones that can differ from an on-policy run only off-policy (aliases once)."""
    from rollwise.optim.objective import ObjectiveConfig

    grpo = ObjectiveConfig(method="grpo").model_dump()
    return [name for name in distinct_presets()
            if any(ObjectiveConfig(method=name).model_dump()[f] != grpo[f] for f in RATIO_FIELDS)]


def default_arms(regimes: list[str] = ("epochs2", "async1")) -> list[str]:
    """Every implemented method id, as ``stage:id`` (baselines and aliases left out), then the
    ratio presets in each off-policy regime (``objective:<id>@<regime>``)."""
    from rollwise.control import CONTROLLERS, EPISODES_ONLY
    from rollwise.generate import STRATEGIES
    from rollwise.replay import REPLAY_METHODS

    return ([f"objective:{n}" for n in distinct_presets()] + [f"strategy:{n}" for n in STRATEGIES if n != "group"]
            + [f"control:{n}" for n in CONTROLLERS if n != "none" and n not in EPISODES_ONLY]  # single-turn tasks
            + [f"replay:{n}" for n in REPLAY_METHODS if n != "none"] + [f"reward:{n}" for n in REWARD_ARMS]
            + [f"objective:{n}@{r}" for r in regimes for n in ratio_presets()])


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
        body, _, regime = arm.partition("@")
        for part in body.split("+"):
            stage, _, name = part.partition(":")
            if stage == "set" and "=" not in name:
                raise ConfigError(f"arms: {arm!r}: {part!r} is not set:key=value (e.g. set:control.xrpo_alloc.bonus=0.1)")
            if (stage not in (*STAGE_KEYS, "regime", "set") or not name) and body != BASELINE:
                raise ConfigError(f"arms: {arm!r} is not stage:id; stages are {', '.join(STAGE_KEYS)}, regime "
                                  "(e.g. objective:dapo, control:vade, objective:cispo@epochs2, regime:async1, "
                                  "objective:dapo+control:vade)")
            if stage == "regime" and name not in REGIMES:
                raise ConfigError(f"arms: {arm!r}: unknown regime {name!r}; regimes are {', '.join(REGIMES)}")
        if "@" in arm and regime not in REGIMES:
            raise ConfigError(f"arms: {arm!r}: unknown regime {regime!r}; regimes are {', '.join(REGIMES)}")
    if cfg.recipe is not None and not Path(cfg.recipe).is_file():
        raise ConfigError(f"recipe: no file {cfg.recipe!r}; give a run config's path (e.g. recipes/smollm2_add.yaml)")
    return cfg


def split_arm(arm: str) -> tuple[str, str | None]:
    """``objective:cispo@epochs2`` -> (``objective:cispo``, ``epochs2``); no regime -> None."""
    body, _, regime = arm.partition("@")
    return body, regime or None


def baseline_of(arm: str) -> str:
    """The arm an arm is compared with: the baseline in its regime (the noise floor: the baseline)."""
    regime = split_arm(arm)[1]
    return BASELINE if regime is None else f"{BASELINE}@{regime}"


def arm_lines(arm: str) -> list[str]:
    """The config lines an arm changes from the baseline (the noise floor's is its sampling seed)."""
    body, regime = split_arm(arm)
    if body == BASELINE:
        lines = []
    elif body == NOISE_FLOOR:
        lines = [f"sampling_seed=seed+{NOISE_SEED_OFFSET}"]  # seed_sets gives the number
    else:
        lines = []
        for part in body.split("+"):
            stage, _, name = part.partition(":")
            if stage == "set":
                lines.append(name)
            else:
                lines += REGIMES[name] if stage == "regime" else [stage_line(stage, name), *ARM_EXTRAS.get(part, [])]
    return lines + (REGIMES[regime] if regime else [])


def stage_line(stage: str, name: str) -> str:
    """The config line of ``stage:name`` (``reward:fapo`` → ``rewards=[{name: fapo}]``)."""
    return f"rewards=[{{name: {name}}}]" if stage == "reward" else f"{STAGE_KEYS[stage]}={name}"


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


def read_results(out: Path, mine: Path) -> list[dict]:
    """Every finished run in ``out`` (every shard's file); ``mine`` is rewritten without a line cut by a kill
    (the other shards' files belong to their processes)."""
    finished = []
    for path in sorted(out.glob("results*.jsonl")):
        records = read_jsonl(path)
        if path == mine:
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        finished += [with_step_summary(r, out) for r in records]
    return finished


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
    results_path = results_file(out, cfg.shard)
    done = {(r["task"], r["arm"], r["seed"]): r for r in read_results(out, results_path)}
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
    done |= {(r["task"], r["arm"], r["seed"]): r for r in read_results(out, results_path)}  # the other shards'
    ledger = {"settings": cfg.model_dump(), "command": "rollwise bench ablate " + " ".join(
        f"--set {o}" for o in overrides), "progress": progress(everything, done, out, cfg.budget), "tasks": {}}
    runs = {task: [r for (t, _, s), r in done.items() if t == task and s in cfg.seeds] for task in tasks}
    for task in tasks:
        ledger["tasks"][task] = summarize(runs[task], arms)
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
        steps = [r for r in read_jsonl(out / "runs" / run_name(task, arm, seed) / "metrics.jsonl") if "tokens/total" in r]
        if steps:
            begun.append({"task": task, "arm": arm, "seed": seed, "step": steps[-1]["step"],
                          "tokens": int(steps[-1]["tokens/total"]), "budget": budget(task)})
    return {"finished": sum((t, a, s) in done for t, s, a in everything), "planned": len(everything), "begun": begun}


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
    except ConfigError as e:
        return record | {"refused": str(e)}
    return record | run.record(seed) | {
        "curve": run.curve, "correct": run.evals[-1]["correct"], "eval_correct": [e["correct"] for e in run.evals],
        "steps": run.summary["steps"], "wall_seconds": run.seconds} | step_summary(run.steps)


def step_summary(steps: list[dict]) -> dict:
    """What a run's kept step metrics say: its zero-signal share and its controller's mean metrics."""
    return {"zero_signal_share": zero_signal_share(steps), "control": metric_means(steps)}


def run_name(task: str, arm: str, seed: int) -> str:
    """The run directory's name under ``out/runs``."""
    return f"{task}_{re.sub(r'[^A-Za-z0-9_.-]', '_', arm)}_{seed}"


def with_step_summary(record: dict, out: Path) -> dict:
    """A record written before runs kept their step summary: read back from the run's directory when
    it is still there (else the record as it is)."""
    run_dir = out / "runs" / run_name(record["task"], record["arm"], record["seed"])
    if "control" in record or "refused" in record or not (run_dir / "metrics.jsonl").exists():
        return record
    steps = history(run_dir, KEEP)[2]
    return record | step_summary(steps) if steps else record


def _effect(rs: dict[int, dict], base: dict[int, dict], seeds: list[int]) -> dict:
    """The paired effect on per-prompt correctness (records of an older ablation without it: on the
    per-seed accuracies alone, the same t rule)."""
    if effect := paired({s: rs[s] for s in seeds}, base, lambda r: r.get("correct")):
        return effect | {"seeds": len(seeds)}
    diffs = [rs[s]["final_accuracy"] - base[s]["final_accuracy"] for s in seeds]
    mean, ci, p = seed_test(diffs)
    return {"difference": mean, "ci95": None if ci is None else list(ci), "p": p, "seed_differences": diffs,
            "seeds": len(seeds), "pairs": None, "prompt_se": None, "verdict": verdict(ci, p)}


def _mean(values: list[float | None]) -> float | None:
    """The mean over the runs that recorded the value (None: none did)."""
    kept = [v for v in values if v is not None]
    return statistics.mean(kept) if kept else None


def _interval(values: list[float]) -> list[float] | None:
    """The 95% t interval of the mean over seeds (None below two values)."""
    ci = seed_test(values)[1] if len(values) >= 2 else None
    return None if ci is None else list(ci)


def _fingerprint(record: dict) -> str | None:
    """What makes two runs the same computation: every step's trace and every eval's correctness per prompt."""
    if "trace" not in record:
        return None
    return json.dumps([record["trace"], record["eval_correct"]])


def summarize(runs: list[dict], arms: list[str]) -> dict[str, dict]:
    """Per arm: accuracy at the budget; the paired effect against its baseline (``rollwise.bench.stats``);
    the first step its runs depart from the baseline's; tokens to the baseline's final accuracy; wall
    time (or the refusal). Arms identical on every seed share one row, keyed by the first, with ``ids``."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    table = {}
    for arm in arms:
        rs = by_arm.get(arm, {})
        if not rs:
            continue
        refused = next((r["refused"] for r in rs.values() if "refused" in r), None)
        if refused is not None:
            table[arm] = {"ids": [arm], "lines": arm_lines(arm), "refused": refused}
            continue
        base = {s: r for s, r in by_arm.get(baseline_of(arm), {}).items() if "refused" not in r}
        seeds = sorted(s for s in rs if s in base)
        ratios, curves = tokens_ratios(rs, base), [r["curve"] for r in rs.values() if r.get("curve")]
        row = {"ids": [arm], "lines": arm_lines(arm), "seeds": len(rs),
               "accuracies": [rs[s]["final_accuracy"] for s in sorted(rs)],
               "accuracy_mean": statistics.mean(rs[s]["final_accuracy"] for s in rs),
               "steps_mean": statistics.mean(r.get("steps", 0) for r in rs.values()),
               "wall_seconds": statistics.mean(r["wall_seconds"] for r in rs.values()),
               "tokens_ratio": statistics.mean(ratios) if ratios else None, "reached": len(ratios),
               "tokens_ratio_ci95": _interval(ratios),
               "curve": mean_curve(curves) if curves else None,  # accuracy over generated tokens, mean over seeds
               "zero_signal_share": _mean([r.get("zero_signal_share") for r in rs.values()]),
               "control": metric_means([r.get("control", {}) for r in rs.values()]),  # mean of the runs' means
               "departs_at": departs_at(rs, base)}
        if seeds and arm != baseline_of(arm):
            row |= _effect(rs, base, seeds)
        elif seeds:
            row |= {"difference": 0.0, "verdict": "baseline"}
        table[arm] = row
    return _with_holm(_merge_identical(table, by_arm))


def _with_holm(table: dict[str, dict]) -> dict[str, dict]:
    """Each method arm's Holm-adjusted p (``p_holm``) over the arms of its regime: the baseline and the
    noise floor (the rule's own check) are not in the family."""
    for regime in dict.fromkeys(split_arm(arm)[1] for arm in table):
        add_holm(table, [arm for arm in table if split_arm(arm)[1] == regime and arm != baseline_of(arm)
                         and split_arm(arm)[0] != NOISE_FLOOR])
    return table


def _merge_identical(table: dict[str, dict], by_arm: dict[str, dict[int, dict]]) -> dict[str, dict]:
    """One row per group of arms of one regime whose runs are identical on every seed, kept under the
    regime's baseline (an arm identical to the baseline is the baseline) or else its first arm,
    listing every id."""
    prints = {arm: {s: _fingerprint(r) for s, r in by_arm[arm].items()} for arm, row in table.items()
              if "refused" not in row and all(_fingerprint(r) is not None for r in by_arm[arm].values())}
    regimes = dict.fromkeys(split_arm(arm)[1] for arm in prints)
    merged = dict(table)
    for group in (g for r in regimes for g in identical_groups({a: p for a, p in prints.items()
                                                                if split_arm(a)[1] == r})):
        if len(group) < 2:
            continue
        keep = next((a for a in group if a == baseline_of(a)), group[0])  # a baseline keeps its row
        ids = [keep, *(a for a in group if a != keep)]
        merged[keep] = table[keep] | {"ids": ids, "lines": list(dict.fromkeys(x for a in ids for x in arm_lines(a)))}
        for arm in group:
            if arm != keep:
                del merged[arm]
    return merged
