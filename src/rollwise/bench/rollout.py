"""``rollwise bench rollout``: rollout strategies side by side, in one run, on one model.

Arms (all in one process, same model object, same prompts, same seeds):

- ``tree`` vs ``group`` — sampling: a model warm-started by SFT on ``arith`` samples
  ``num_generations`` leaves per prompt for ``num_prompts`` prompts with each strategy,
  alternating the two ``repeats`` times. Reported: tokens the engine sampled per leaf
  (deterministic for a seed), wall time (median), mean reward, distinct completions per
  group and groups with mixed rewards (the groups that carry a GRPO signal).
- ``tree`` vs ``group`` — training at equal compute: from the same warm start, a GRPO run
  per arm and seed stops once the engine has sampled ``train_tokens`` tokens
  (``train.max_generated_tokens``); reported: greedy eval accuracy on the held-out split
  before and after, steps taken, wall time.
- ``latr`` vs ``group`` — sampling, as for the tree: tokens per leaf, wall, diversity,
  branches and pruned branches per prompt.
- ``april`` vs ``group`` — throughput on a long-tail workload: an untrained model (its
  lengths are geometric, EOS has probability ~1/vocab per token, so a few completions run
  to ``april_max_new_tokens`` while most stop far earlier) generates ``april_steps``
  consecutive steps of ``april_prompts`` groups, the weights reloaded between steps as in
  training (each load bumps the policy version). Throughput = tokens of the complete groups
  a step returns, per second of generation. APRIL's leftover buffer at the end is work done
  but not counted. Both arms alternate ``repeats`` times; medians are reported.

Ratios are measured side by side in this run; absolute times on a shared machine are noise.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.harness import load_settings, session, table, threads_set, train_run, warm_start
from rollwise.config import StrictModel
from rollwise.generate.latr import LatrConfig
from rollwise.generate.tree import TreeConfig
from rollwise.optim.advantages import is_zero_signal

ARMS = ("tree", "latr", "april", "train")


class RolloutBenchConfig(StrictModel):
    """Settings of ``rollwise bench rollout`` (override with ``--set key=value``)."""

    arms: list[Literal["tree", "latr", "april", "train"]] = Field(list(ARMS), min_length=1,
                                                                   description="what to run")
    seed: int = Field(0, ge=0, description="seeds the warm start, prompts and sampling")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default); 1 is steadiest on shared machines")
    preset: str = Field("tiny", description="model preset (random init, then SFT)")
    sft_steps: int = Field(500, ge=0, description="SFT warm-start steps on arith before sampling and training")
    min_digits: int = Field(4, ge=1, description="arith operand digits, lowest (longer completions share more)")
    max_digits: int = Field(5, ge=1, description="arith operand digits, highest")
    num_prompts: int = Field(64, ge=1, description="sampling arms: prompts per run")
    num_generations: int = Field(8, ge=1, description="leaves (rollouts) per prompt, equal for every arm")
    max_new_tokens: int = Field(96, ge=1, description="completion limit for the arith arms")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    repeats: int = Field(3, ge=1, description="timed runs per arm, alternating; medians reported")
    tree: TreeConfig = Field(default_factory=lambda: TreeConfig(segment_len=16, max_depth=3),
                             description="the tree arm's rollout.tree")
    latr: LatrConfig = Field(default_factory=lambda: LatrConfig(lookahead=16),
                             description="the latr arm's rollout.latr")
    train_seeds: list[int] = Field([0, 1, 2], min_length=1, description="RL seeds per training arm")
    train_tokens: int = Field(150_000, ge=1, description="generated-token budget of each training run")
    train_lr: float = Field(3e-5, gt=0, description="GRPO learning rate")
    prompts_per_step: int = Field(16, ge=1, description="training: groups per step")
    eval_size: int = Field(200, ge=1, description="held-out prompts for greedy accuracy")
    april_prompts: int = Field(16, ge=1, description="april arm: groups a step needs")
    april_steps: int = Field(6, ge=1, description="april arm: consecutive steps timed")
    april_max_new_tokens: int = Field(480, ge=1, description="april arm: completion limit of the long-tail workload")
    april_over_provision: float = Field(1.5, ge=1, description="april arm: rollout.april.over_provision")


def load_rollout_bench_config(overrides: list[str]) -> RolloutBenchConfig:
    return load_settings(RolloutBenchConfig, overrides)


def run_rollout_bench(overrides: list[str], console) -> dict:
    """Run the arms of ``cfg.arms``; print a table per arm; return the results (see module docstring)."""
    cfg = load_rollout_bench_config(overrides)
    with session(cfg.threads) as tmp:
        return _run(cfg, console, tmp)


def _run(cfg: RolloutBenchConfig, console, tmp: Path) -> dict:
    out: dict = {"settings": cfg.model_dump(), "torch_threads": torch.get_num_threads()}
    needs_warm = {"tree", "latr", "train"} & set(cfg.arms)
    warm = _warm_start(cfg, tmp, console) if needs_warm else None
    if "tree" in cfg.arms or "latr" in cfg.arms:
        sampling = _sampling_arms(cfg, warm, console)
        for arm in ("tree", "latr"):
            if arm in cfg.arms:
                group, mine = sampling["group"], sampling[arm]
                out[arm] = {"sampling": {"group": group, arm: mine},
                            "tokens_per_leaf_ratio": mine["tokens_per_leaf"] / group["tokens_per_leaf"],
                            "wall_ratio": mine["seconds"] / group["seconds"]}
    if "train" in cfg.arms:
        runs = _training_arms(cfg, warm, tmp, console)
        tree = out.setdefault("tree", {})
        tree["training"] = runs
        tree["accuracy_group"] = [r["final_accuracy"] for r in runs["group"]]
        tree["accuracy_tree"] = [r["final_accuracy"] for r in runs["tree"]]
    if "april" in cfg.arms:
        out["april"] = _april_arm(cfg, console)
    _print(console, cfg, out)
    return out


# -- the warm start ------------------------------------------------------------------------
def _task_overrides(cfg: RolloutBenchConfig) -> list[str]:
    return ["task.name=arith", f"task.min_digits={cfg.min_digits}", f"task.max_digits={cfg.max_digits}",
            f"task.eval_size={cfg.eval_size}"]


def _warm_start(cfg: RolloutBenchConfig, tmp: Path, console) -> Path:
    """SFT the preset on arith (all digit counts up to max_digits, as the demo does); return its directory."""
    return warm_start(tmp, "warm", [f"seed={cfg.seed}", f"model.preset={cfg.preset}", "task.name=arith",
                                    f"task.max_digits={cfg.max_digits}", f"sft.steps={cfg.sft_steps}", threads_set()],
                      console)


# -- sampling arms -------------------------------------------------------------------------
def _sampling_arms(cfg: RolloutBenchConfig, warm: Path, console) -> dict:
    from rollwise.engine.sampling import SamplingParams
    from rollwise.engine.slots import SlotEngine
    from rollwise.filter.registry import resolve_rewards
    from rollwise.filter.rewards import score_groups
    from rollwise.generate.group import GroupSampler
    from rollwise.generate.latr import LatrSampler
    from rollwise.generate.tree import TreeSampler
    from rollwise.model.load import ModelConfig, encode_prompt, load_model_and_tokenizer
    from rollwise.tasks.arith import ArithConfig

    model, tok = load_model_and_tokenizer(ModelConfig(path=str(warm)))
    task = ArithConfig(min_digits=cfg.min_digits, max_digits=cfg.max_digits).build(cfg.seed)
    prompts = [task.train.get(i) for i in range(cfg.num_prompts)]
    for p in prompts:
        p.token_ids = encode_prompt(tok, p)
    params = SamplingParams(cfg.temperature, 1.0, 0, cfg.max_new_tokens, (tok.eos_token_id,))

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    rewards, _ = resolve_rewards(None, task)
    samplers = {"group": lambda: GroupSampler(params, decode)}
    if "tree" in cfg.arms:
        samplers["tree"] = lambda: TreeSampler(params, decode, cfg.tree)
    if "latr" in cfg.arms:
        samplers["latr"] = lambda: LatrSampler(params, decode, cfg.latr)
    runs: dict[str, list] = {name: [] for name in samplers}
    with console.status("sampling arms") as status:
        for rep in range(cfg.repeats):
            for name, make in samplers.items():
                status.update(f"sampling: {name}, run {rep + 1}/{cfg.repeats}")
                engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=256, seed=cfg.seed)
                sampler = make()
                start = time.perf_counter()
                groups, metrics = sampler.generate(engine, prompts, [cfg.num_generations] * len(prompts), seed=cfg.seed)
                seconds = time.perf_counter() - start
                score_groups(groups, rewards)
                runs[name].append((seconds, groups, engine.stats.decode_tokens, metrics))
    results = {}
    for name, rs in runs.items():
        seconds, groups, sampled, metrics = rs[0]
        leaves = sum(len(g.rollouts) for g in groups)
        results[name] = {
            "seconds": statistics.median(r[0] for r in rs),
            "tokens_per_leaf": sampled / leaves,
            "leaves_per_prompt": leaves / len(groups),
            "mean_reward": sum(r.reward for g in groups for r in g.rollouts) / leaves,
            "distinct_per_group": sum(len({tuple(r.completion_ids) for r in g.rollouts}) for g in groups) / len(groups),
            "mixed_groups": sum(not is_zero_signal(g.rewards) for g in groups) / len(groups),
            "same_tokens_every_run": len({r[2] for r in rs}) == 1,
            **{k.split("/", 1)[1]: v for k, v in metrics.items()},
        }
    return results


# -- training arms -------------------------------------------------------------------------
def _training_arms(cfg: RolloutBenchConfig, warm: Path, tmp: Path, console) -> dict:
    """GRPO with ``group`` and with ``tree`` sampling, per seed, to the same generated-token budget."""
    tree_opts = [f"rollout.tree.{k}={v}" for k, v in cfg.tree.model_dump().items()]
    runs: dict[str, list] = {"group": [], "tree": []}
    for seed in cfg.train_seeds:
        for arm in ("group", "tree"):
            sets = [f"output_dir={tmp}", f"name=train_{arm}_{seed}", f"seed={seed}", f"model.path={warm}",
                    threads_set(), *_task_overrides(cfg), "sft.steps=0", f"rollout.strategy={arm}", *tree_opts,
                    f"rollout.num_generations={cfg.num_generations}",
                    f"rollout.prompts_per_step={cfg.prompts_per_step}", f"rollout.max_new_tokens={cfg.max_new_tokens}",
                    f"rollout.temperature={cfg.temperature}",
                    "objective.method=grpo", f"optim.lr={cfg.train_lr}", "optim.micro_batch_size=128",
                    "train.steps=100000", f"train.max_generated_tokens={cfg.train_tokens}", "train.eval_samples=0",
                    "train.log_samples=0"]
            s = train_run(sets, console, f"training: {arm}, seed {seed}", tokens=cfg.train_tokens).summary
            runs[arm].append({"seed": seed, "initial_accuracy": s["initial_accuracy"],
                              "final_accuracy": s["final_accuracy"], "steps": s["steps"],
                              "generated_tokens": s["generated_tokens"], "seconds": s["wall_seconds"]})
    return runs


# -- april ---------------------------------------------------------------------------------
def _april_arm(cfg: RolloutBenchConfig, console) -> dict:
    """group, april and april with reuse_kv, alternating ``repeats`` times on the long-tail workload."""
    from rollwise.engine.sampling import SamplingParams
    from rollwise.generate.april import AprilConfig, AprilSampler
    from rollwise.generate.group import GroupSampler
    from rollwise.model.tiny import build_tiny
    from rollwise.tasks.arith import ArithConfig

    model, tok = build_tiny(cfg.preset, seed=cfg.seed)
    model.eval()
    task = ArithConfig(max_digits=cfg.max_digits).build(cfg.seed)
    limit = model.config.max_position_embeddings - 32
    params = SamplingParams(cfg.temperature, 1.0, 0, min(cfg.april_max_new_tokens, limit), (tok.eos_token_id,))

    def decode(ids):
        return ""

    def april(reuse_kv: bool):
        return lambda: AprilSampler(params, decode, AprilConfig(over_provision=cfg.april_over_provision,
                                                                reuse_kv=reuse_kv), target=cfg.april_prompts)

    arms = {"group": lambda: GroupSampler(params, decode), "april": april(False), "april_reuse_kv": april(True)}
    runs: dict[str, list] = {name: [] for name in arms}
    with console.status("april arm") as status:
        for rep in range(cfg.repeats):
            for name, make in arms.items():
                status.update(f"april: {name}, run {rep + 1}/{cfg.repeats}")
                runs[name].append(_april_run(cfg, model, tok, task, make()))
    medians = {name: sorted(rs, key=lambda r: r["tokens_per_second"])[(len(rs) - 1) // 2]
               for name, rs in runs.items()}
    group = medians["group"]["tokens_per_second"]
    return {
        "throughput_ratio": medians["april"]["tokens_per_second"] / group,
        "paired_ratios": [a["tokens_per_second"] / g["tokens_per_second"]
                          for a, g in zip(runs["april"], runs["group"])],
        "reuse_kv_throughput_ratio": medians["april_reuse_kv"]["tokens_per_second"] / group,
        **medians,
    }


def _april_run(cfg: RolloutBenchConfig, model, tok, task, sampler) -> dict:
    """``april_steps`` consecutive steps of ``sampler`` on a fresh engine, the weights reloaded between
    steps as in training; throughput counts the tokens of the complete groups a step returns."""
    from rollwise.engine.slots import SlotEngine

    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=512, seed=cfg.seed)
    cursor, seconds, lengths, groups_done = 0, 0.0, [], 0
    for step in range(cfg.april_steps):
        n = sampler.prompts_wanted(cfg.april_prompts)
        prompts = [task.train.get(cursor + i) for i in range(n)]
        cursor += n
        for p in prompts:
            p.token_ids = tok(p.text)["input_ids"]
        start = time.perf_counter()
        groups, _ = sampler.generate(engine, prompts, [cfg.num_generations] * n, seed=cfg.seed * 1000 + step)
        seconds += time.perf_counter() - start
        engine.load_weights(model)  # as between training steps: the version moves
        groups_done += len(groups)
        lengths += [r.num_tokens for g in groups for r in g.rollouts]
    stats = engine.stats
    return {"tokens_per_second": sum(lengths) / seconds, "sampled_per_second": stats.decode_tokens / seconds,
            "seconds": seconds, "group_tokens": sum(lengths), "groups": groups_done,
            "sampled_tokens": stats.decode_tokens, "reprefill_tokens": stats.reprefill_tokens,
            "restored_tokens": stats.restored_tokens, "median_length": statistics.median(lengths),
            "max_length": max(lengths)}


# -- report --------------------------------------------------------------------------------
def _print(console, cfg: RolloutBenchConfig, out: dict) -> None:
    for arm in ("tree", "latr"):
        if "sampling" in out.get(arm, {}):
            _print_sampling(console, cfg, arm, out[arm])
    if "training" in out.get("tree", {}):
        _print_training(console, cfg, out["tree"])
    if "april" in out:
        a = out["april"]
        console.print(table(
            f"april vs group on a long-tail workload — {cfg.april_steps} steps x {cfg.april_prompts} groups of "
            f"{cfg.num_generations}, median of {cfg.repeats}",
            ("strategy", "group tok/s", "sampled tok/s", "groups", "sampled", "re-prefilled", "restored", "median len",
             "max len"),
            [[name, f"{r['tokens_per_second']:,.0f}", f"{r['sampled_per_second']:,.0f}", str(r["groups"]),
              f"{r['sampled_tokens']:,}", f"{r['reprefill_tokens']:,}", f"{r['restored_tokens']:,}",
              f"{r['median_length']:.0f}", str(r["max_length"])]
             for name, r in ((n, a[n]) for n in ("group", "april", "april_reuse_kv"))]))
        console.print(f"april: throughput {a['throughput_ratio']:.2f}x group's (paired runs: "
                      f"{', '.join(f'{x:.2f}' for x in a['paired_ratios'])}); with reuse_kv "
                      f"{a['reuse_kv_throughput_ratio']:.2f}x", highlight=False)


def _print_sampling(console, cfg: RolloutBenchConfig, arm: str, out: dict) -> None:
    console.print(table(
        f"{arm} vs group sampling — {cfg.num_prompts} arith prompts ({cfg.min_digits}-{cfg.max_digits} digits) x "
        f"{cfg.num_generations} leaves, median of {cfg.repeats}",
        ("strategy", "tokens/leaf", "wall s", "mean reward", "distinct/group", "mixed groups"),
        [[name, f"{r['tokens_per_leaf']:.1f}", f"{r['seconds']:.2f}", f"{r['mean_reward']:.3f}",
          f"{r['distinct_per_group']:.2f}", f"{r['mixed_groups']:.0%}"] for name, r in out["sampling"].items()]))
    console.print(f"{arm}: tokens per leaf {out['tokens_per_leaf_ratio']:.2f}x group's, "
                  f"wall {out['wall_ratio']:.2f}x", highlight=False)


def _print_training(console, cfg: RolloutBenchConfig, tree: dict) -> None:
    console.print(table(
        f"GRPO at equal generated tokens ({cfg.train_tokens:,} per run): greedy eval accuracy, {cfg.eval_size} "
        "held-out prompts", ("strategy", "seed", "before", "after", "steps", "wall s"),
        [[arm, str(r["seed"]), f"{r['initial_accuracy']:.1%}", f"{r['final_accuracy']:.1%}", str(r["steps"]),
          f"{r['seconds']:.0f}"] for arm, rs in tree["training"].items() for r in rs]))
    g, t = tree["accuracy_group"], tree["accuracy_tree"]
    console.print(f"mean final accuracy: group {statistics.mean(g):.1%}, tree {statistics.mean(t):.1%}",
                  highlight=False)
