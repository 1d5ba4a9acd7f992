"""``rollwise bench trl``: rollwise vs TRL's ``GRPOTrainer``, same model, data, reward and settings.

Per seed: one SFT warm start (a rollwise run with ``sft.steps`` and ``train.steps=0``; its
``init_model`` directory is a Hugging Face model dir), then two arms start from it —
rollwise (``Trainer.fit``) and TRL (``GRPOTrainer.train`` on CPU, ``use_cpu=True``) — with the
hyperparameters of ``settings_mapping`` and the same training prompts in the same order (TRL's
dataset is the rollwise task's train stream, ``shuffle_dataset=False``), scored by the same
reward function object (the task's TRL-convention ``fn(prompts, completions, completion_ids,
**columns)``).

**One precision** (``precision``): TRL gets the precision rollwise uses. ``auto``: where the
CPU has native bf16 (``hardware.native_bf16``: AVX-512 BF16 or AMX) TRL runs with ``bf16=True``
(autocast to bf16 for its generation and its update, fp32 master weights) and rollwise with
``rollout.engine_dtype=auto`` and ``optim.compute_dtype=auto`` (its engine's own bf16 copy and
its update under bf16 autocast, fp32 master weights, where bf16 measures faster at the model's
shapes, ``train/precision.py``); elsewhere both fp32. ``float32`` / ``bfloat16`` set both arms.
Each arm's result and the table say what it ran in (rollwise: the engine's and the update's
dtypes and why; TRL: ``bf16``).

**Lockstep.** Both arms run in one process, each in its own thread, but never at the same
time: a conductor hands a baton to one arm for one training step, then to the other, and who
goes first alternates every step (and between seeds), so a change in the machine's load hits
both alike. Each arm keeps its own global RNG state across the hand-overs (TRL samples with
the global torch generator; rollwise's engine has per-request generators). One torch thread
(``threads``) for both.

**One evaluator.** Greedy accuracy (plain HF ``model.generate``, ``do_sample=False``, left-padded
batches) on the task's held-out prompts, judged by the task's reward, run on each arm's live
model every ``eval_every`` steps, outside the timed span. rollwise's own evaluator (its engine)
also runs at the start and the end, as a cross-check of the common one.

**What is timed** (``time.perf_counter``, per training step):

- ``loop``: wall time from the moment an arm gets the baton to the end of its step (the eval
  excluded): everything its loop does per step, logging and data loading included. Time to
  target and s/step are sums and means of this.
- rollwise ``generate`` / ``score`` / ``update``: its own ``time/*`` metrics (engine sampling and
  decoding; the reward functions; advantages, batch building, forward/backward, optimizer step,
  engine weight sync).
- TRL ``generate``: time inside ``GRPOTrainer._generate`` (prompt tokenization, HF ``generate``,
  decoding, length metrics); ``score``: inside ``_calculate_rewards``; ``update``: the HF step
  (``on_step_begin`` → ``on_step_end``) minus those two — padding, advantages, the loss
  forward/backward, clipping, optimizer and scheduler steps.
- ``other`` = ``loop`` − generate − score − update (rollwise: prompt selection, rollout metrics,
  metrics.jsonl; TRL: the dataloader fetch, logging, callbacks).

**Workloads.** ``short``: the demo's ``arith`` (1–5 digits, ~35-token completions,
``max_new_tokens`` 96). ``long``: the same kind of problems (``long_min_digits``..``long_max_digits``
digits) with the column-by-column working written out in words (``long_working``), ~200–330-token
completions, ``max_new_tokens`` 384, run through rollwise as a ``file`` task (JSONL written to
the bench's temporary directory, ``demo_field`` for SFT, the built-in ``arith`` reward).
``smollm2`` and ``smollm2_signal``: the real model, chat prompts (``bench/chat.py``). No SFT: both
arms start from ``model_path`` (rollwise loads it through its loader — a GGUF is converted once
into the cache; TRL gets that converted HF directory); TRL's dataset holds the prompts as
messages, so it applies the same chat template (checked: its prompt ids must equal rollwise's),
and both arms call one importable reward function (TRL hands it conversational completions,
``[{"role": "assistant", "content": ...}]``). These workloads change some defaults
(``CHAT_DEFAULTS``: one seed, 10 steps, 8 prompts x 8, micro-batches of 16, lr 1e-5, 64 new
tokens); a ``--set`` wins over them. Per step each arm also reports its share of zero-signal
groups (rollwise ``groups/zero_signal``, TRL ``frac_reward_zero_std``): rollwise skips their rows
in the update and TRL does not, so the ratio is read beside it.

Needs the ``compare`` extra (``pip install 'rollwise[compare]'``: TRL).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import Field

from rollwise import hardware
from rollwise.bench.chat import CHAT_WORKLOADS, REWARDS, SMOLLM2, TEMPERATURES
from rollwise.bench.chat import task_overrides as chat_task_overrides
from rollwise.bench.harness import load_settings, session, table, warm_start
from rollwise.bench.lockstep import Evaluator, Lockstep
from rollwise.bench.trl_arms import RollwiseArm, TRLArm, precision_label, trl_bf16
from rollwise.config import ConfigError, StrictModel

ARMS = ("rollwise", "trl")
PHASES = ("generate", "score", "update", "other")


class TRLBenchConfig(StrictModel):
    """Settings of ``rollwise bench trl`` (override with ``--set key=value``); both arms get the same."""

    workload: Literal["short", "long", "smollm2", "smollm2_signal"] = Field(
        "short", description="short: arith (~35 tokens); long: arith with the working in words (~200-330 tokens); "
        "smollm2: chain_sum chat prompts on model_path, the recipe's strict judge; smollm2_signal: an easier, "
        "lenient variant where nearly every group has signal (bench/chat.py)")
    model_path: str = Field(SMOLLM2, description="smollm2 workloads: the policy both arms start from (rollwise "
                            "model.path: a GGUF, pkg: path or HF directory)")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="one warm start and one run per arm for each seed")
    steps: int = Field(60, ge=1, description="RL steps per arm and seed")
    eval_every: int = Field(10, ge=1, description="common greedy eval every N steps (and at step 0)")
    eval_size: int = Field(200, ge=1, description="held-out prompts in every eval")
    target: float | None = Field(None, gt=0, le=1, description="accuracy for time-to-target; null = the best "
                                 "accuracy every arm reached in every seed")
    preset: str = Field("tiny", description="model preset of the warm start (rollwise model.preset)")
    sft_steps: int = Field(500, ge=1, description="SFT warm-start steps (rollwise sft.steps)")
    sft_batch_size: int = Field(64, ge=1, description="SFT demonstrations per step")
    num_generations: int = Field(8, ge=2, description="rollouts per prompt (G)")
    prompts_per_step: int = Field(16, ge=1, description="prompts per training step")
    micro_batch_size: int = Field(128, ge=1, description="rollouts per forward/backward (TRL "
                                  "per_device_train_batch_size); must divide G x prompts_per_step")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    max_new_tokens: int | None = Field(None, ge=1, description="completion limit; null = 96 (short) or 384 (long)")
    lr: float = Field(3e-5, gt=0, description="AdamW learning rate (constant, no warmup)")
    long_min_digits: int = Field(4, ge=1, le=12, description="long workload: fewest digits per operand")
    long_max_digits: int = Field(5, ge=1, le=12, description="long workload: most digits per operand")
    long_train_rows: int = Field(20_000, ge=100, description="long workload: rows in the generated train file")
    threads: int = Field(1, ge=1, description="torch threads, both arms")
    trl_gradient_checkpointing: bool = Field(False, description="TRL's activation recomputation (TRL's own default "
                                             "is on; rollwise does not recompute, so off for equal work)")
    arms: list[Literal["rollwise", "trl"]] = Field(list(ARMS), min_length=1, description="which arms to run")
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="both arms' precision: auto = bf16 where the CPU has native bf16 (rollwise "
        "rollout.engine_dtype=auto, TRL bf16=True), else fp32; float32 / bfloat16 set both")


def settings_mapping(cfg: TRLBenchConfig, info: hardware.CpuInfo | None = None) -> list[tuple[str, str, str]]:
    """(setting, rollwise key = value, TRL GRPOConfig field = value) for the docs and the JSON."""
    g, p, mb = cfg.num_generations, cfg.prompts_per_step, cfg.micro_batch_size
    bf16 = trl_bf16(cfg.precision, info)
    chat = [
        ("model", f"model.path={cfg.model_path} (rollwise's loader; no SFT)",
         "AutoModelForCausalLM.from_pretrained(the loader's HF directory for it), float32"),
        ("prompts", f"task: {' '.join(chat_task_overrides(cfg.workload, cfg.eval_size))}, through the chat template",
         "the same prompts as messages; TRL applies the same chat template (prompt ids checked equal)"),
        ("reward", f"rewards=[{{name: {REWARDS[cfg.workload]}}}]", "reward_funcs=[the same function object]"),
    ] if cfg.workload in CHAT_WORKLOADS else []
    return chat + [
        ("rollouts per prompt", f"rollout.num_generations={g}", f"num_generations={g}"),
        ("prompts per step", f"rollout.prompts_per_step={p}",
         f"generation_batch_size = per_device_train_batch_size x gradient_accumulation_steps = {g * p}"),
        ("rollouts per forward/backward", f"optim.micro_batch_size={mb}",
         f"per_device_train_batch_size={mb}, gradient_accumulation_steps={g * p // mb}"),
        ("sampling", f"rollout.temperature={cfg.temperature}, top_p=1, top_k=0",
         f"temperature={cfg.temperature}, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0"),
        ("completion limit", f"rollout.max_new_tokens={max_new_tokens(cfg)}",
         f"max_completion_length={max_new_tokens(cfg)}"),
        ("objective", "objective.method=grpo (scale_rewards=group, loss_agg=seq_mean_token_mean)",
         "loss_type=grpo, scale_rewards=group"),
        ("clip", "objective.epsilon=0.2 (epsilon_high = epsilon)", "epsilon=0.2, epsilon_high=None"),
        ("KL", "objective.beta=0 (no reference model)", "beta=0.0 (no reference model)"),
        ("IS correction", "objective.tis_mode=none", "none (only with vLLM)"),
        ("passes per batch", "optim.num_iterations=1",
         "num_iterations=1, steps_per_generation=gradient_accumulation_steps"),
        ("optimizer", f"AdamW lr={cfg.lr}, betas=(0.9, 0.99), eps=1e-8, weight_decay=0",
         f"optim=adamw_torch, learning_rate={cfg.lr}, adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8, "
         "weight_decay=0"),
        ("schedule", "optim.schedule=constant, warmup_steps=0", "lr_scheduler_type=constant, warmup_steps=0"),
        ("grad clip", "optim.max_grad_norm=1.0", "max_grad_norm=1.0"),
        ("truncated completions", "objective.mask_truncated_completions=false",
         "mask_truncated_completions=False"),
        ("data order", "the task's train stream from its cursor",
         "the same prompts as a Dataset, shuffle_dataset=False"),
        ("activation checkpointing",
         "none (the LM head is chunked only past optim.logits_budget_mb: never at this vocabulary)",
         f"activation_checkpointing (was gradient_checkpointing)={cfg.trl_gradient_checkpointing} "
         "(TRL's default: True)"),
        ("device, precision", f"CPU, rollout.engine_dtype={cfg.precision} (the engine's own copy), "
         f"optim.compute_dtype={cfg.precision} (autocast, fp32 master weights), model.threads={cfg.threads}",
         f"use_cpu=True, bf16={bf16}, fp16=False ({'bf16 autocast, fp32 master weights' if bf16 else 'float32'}), "
         f"torch threads={cfg.threads}"),
    ]


def max_new_tokens(cfg: TRLBenchConfig) -> int:
    return cfg.max_new_tokens or {"short": 96, "long": 384}.get(cfg.workload, 64)


# the chat workloads' defaults (a 135M model on a CPU: one seed, short runs); --set overrides win
CHAT_DEFAULTS = {"seeds": [0], "steps": 10, "eval_every": 5, "eval_size": 50, "prompts_per_step": 8,
                 "num_generations": 8, "micro_batch_size": 16, "lr": 1e-5}  # lr: recipes/smollm2.yaml's


def load_trl_config(overrides: list[str]) -> TRLBenchConfig:
    cfg = load_settings(TRLBenchConfig, overrides)
    if cfg.workload in CHAT_WORKLOADS:
        cfg = load_settings(TRLBenchConfig, overrides, CHAT_DEFAULTS | {"temperature": TEMPERATURES[cfg.workload]})
    if cfg.workload == "long" and cfg.long_min_digits > cfg.long_max_digits:
        raise ConfigError("long_min_digits must be <= long_max_digits")
    if (cfg.num_generations * cfg.prompts_per_step) % cfg.micro_batch_size:
        raise ConfigError(f"micro_batch_size ({cfg.micro_batch_size}) must divide num_generations x prompts_per_step "
                          f"({cfg.num_generations * cfg.prompts_per_step})")
    return cfg


def run_trl_bench(overrides: list[str], console) -> dict:
    cfg = load_trl_config(overrides)
    if "trl" in cfg.arms:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise ConfigError("bench trl needs TRL: pip install 'rollwise[compare]'") from None
    out = {"settings": cfg.model_dump(), "mapping": settings_mapping(cfg), "torch_threads": cfg.threads, "seeds": {}}
    with session(cfg.threads) as tmp:
        for i, seed in enumerate(cfg.seeds):
            order = cfg.arms if i % 2 == 0 else cfg.arms[::-1]  # who goes first alternates between seeds too
            out["seeds"][seed] = run_seed(cfg, seed, list(order), tmp, console)
    out["summary"] = summarize(cfg, out["seeds"])
    print_results(console, cfg, out)
    return out


# -- the workloads ---------------------------------------------------------------------------------

_COLUMN = re.compile(r"^(\d)([+-])(\d)[+-](\d)=(\d)(\d)$")


def long_working(a: int, op: str, b: int) -> str:
    """The ``arith`` working of ``a op b`` written out in words (the long workload's completions).

    >>> long_working(47, "+", 8)[:60]
    ' column 1: 7 plus 8 plus carry 0 is 15, write 5 carry 1. col'
    """
    from rollwise.tasks.arith import solve

    words = []
    for i, token in enumerate(t for t in solve(a, op, b).split() if t != "neg" and not t.startswith("#")):
        x, sign, y, c, hi, lo = _COLUMN.match(token).groups()
        if sign == "+":
            words.append(f"column {i + 1}: {x} plus {y} plus carry {c} is {hi}{lo}, write {lo} carry {hi}.")
        else:
            words.append(f"column {i + 1}: {x} minus {y} minus borrow {c} is {lo}, borrow {hi}.")
    answer = a + b if op == "+" else a - b
    negative = "negative, so take the larger minus the smaller. " if op == "-" and a < b else ""
    return f" {negative}{' '.join(words)} the answer is #{answer}"


def task_overrides(cfg: TRLBenchConfig, seed: int, tmp: Path) -> list[str]:
    """The rollwise ``task.*`` overrides of the workload (writing the long workload's JSONL files)."""
    if cfg.workload in CHAT_WORKLOADS:
        return [*chat_task_overrides(cfg.workload, cfg.eval_size), f"rewards=[{{name: {REWARDS[cfg.workload]}}}]"]
    if cfg.workload == "short":
        return ["task.name=arith", "task.min_digits=1", "task.max_digits=5", f"task.eval_size={cfg.eval_size}"]
    from rollwise.tasks.arith import build

    lo, hi = cfg.long_min_digits, cfg.long_max_digits
    task = build(seed, cfg.eval_size, lo, hi, "+-")
    train = [task.train.get(i) for i in range(cfg.long_train_rows)]
    paths = {}
    for split, prompts in (("train", train), ("eval", task.eval)):
        paths[split] = tmp / f"long-{seed}-{split}.jsonl"
        with paths[split].open("w") as f:
            for p in prompts:
                c = p.columns
                f.write(json.dumps({"prompt": p.text, "answer": p.answer,
                                    "demo": long_working(c["a"], c["op"], c["b"])}) + "\n")
    return ["task.name=file", f"task.path={paths['train']}", f"task.eval_path={paths['eval']}",
            "task.demo_field=demo", "task.reward=arith", f"task.eval_size={cfg.eval_size}"]


def rollwise_overrides(cfg: TRLBenchConfig, seed: int, tmp: Path) -> list[str]:
    return [
        f"output_dir={tmp}", f"seed={seed}", f"model.preset={cfg.preset}", f"model.threads={cfg.threads}",
        *task_overrides(cfg, seed, tmp),
        f"sft.steps={cfg.sft_steps}", f"sft.batch_size={cfg.sft_batch_size}",
        f"rollout.num_generations={cfg.num_generations}", f"rollout.prompts_per_step={cfg.prompts_per_step}",
        f"rollout.temperature={cfg.temperature}", "rollout.top_p=1.0", "rollout.top_k=0",
        f"rollout.max_new_tokens={max_new_tokens(cfg)}", f"rollout.engine_dtype={cfg.precision}",
        f"optim.compute_dtype={cfg.precision}",
        "objective.method=grpo", "objective.beta=0", "objective.tis_mode=none", "objective.epsilon=0.2",
        "objective.mask_truncated_completions=false",
        f"optim.lr={cfg.lr}", f"optim.micro_batch_size={cfg.micro_batch_size}", "optim.num_iterations=1",
        "optim.betas=[0.9,0.99]", "optim.weight_decay=0", "optim.max_grad_norm=1.0", "optim.warmup_steps=0",
        "optim.schedule=constant",
        "train.eval_every=0", "train.checkpoint_every=0", "train.eval_samples=0", f"train.eval_size={cfg.eval_size}",
        "train.log_samples=0",
    ]


# -- one seed: warm start, both arms in lockstep ---------------------------------------------------

def run_seed(cfg: TRLBenchConfig, seed: int, order: list[str], tmp: Path, console) -> dict:
    """One warm start (the chat workloads: the model itself), then both arms in lockstep from it."""
    from rollwise.filter.rewards import load_callable
    from rollwise.model.load import model_dir
    from rollwise.train.config import load_run_config

    base = rollwise_overrides(cfg, seed, tmp)
    if cfg.workload in CHAT_WORKLOADS:  # no warm start: both arms start from the model itself
        run_cfg = load_run_config(None, [*base, f"model.path={cfg.model_path}"])
        start, warm_dir = cfg.model_path, model_dir(run_cfg.model)
        reward = load_callable(REWARDS[cfg.workload])  # the object rollwise's `rewards` entry imports too
    else:
        run_cfg = load_run_config(None, base)
        start = warm_dir = warm_start(tmp, f"warm-{seed}", base, console)
        reward = None
    task = run_cfg.task.build(seed)
    reward = reward or next(iter(task.rewards.values()))
    evaluator = Evaluator(task.eval[: cfg.eval_size], reward, max_new_tokens(cfg))
    prompts = [task.train.get(i) for i in range(cfg.steps * cfg.prompts_per_step)]
    builders = {"rollwise": lambda: RollwiseArm(load_run_config(None, [
                    *base, f"name=rollwise-{seed}", f"model.path={start}", "sft.steps=0", f"train.steps={cfg.steps}"])),
                "trl": lambda: TRLArm(trl_config(cfg, seed, tmp / f"trl-{seed}"), warm_dir, prompts, reward)}
    arms = {name: builders[name]() for name in order}
    with console.status(f"seed {seed}: eval at step 0"):
        for arm in arms.values():
            arm.evals.append(evaluator.record(arm.model, arm.tokenizer, 0, 0.0))
    lockstep = Lockstep(arms, cfg.eval_every, evaluator)
    with console.status(f"seed {seed}") as status:
        lockstep.run(cfg.steps, order, on_step=lambda step: status.update(
            f"seed {seed}: step {step}/{cfg.steps} " + " ".join(
                f"{n} {a.evals[-1]['accuracy']:.1%}" for n, a in arms.items())))
    return {name: arm.result() for name, arm in arms.items()}


def trl_config(cfg: TRLBenchConfig, seed: int, out_dir: Path, info: hardware.CpuInfo | None = None):
    """TRL's ``GRPOConfig`` with the settings of ``settings_mapping`` (``info``: the CPU ``precision=auto``
    reads, default this one)."""
    from trl import GRPOConfig

    g, p, mb = cfg.num_generations, cfg.prompts_per_step, cfg.micro_batch_size
    return GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=trl_bf16(cfg.precision, info), fp16=False, seed=seed,
        data_seed=seed,
        max_steps=cfg.steps, per_device_train_batch_size=mb, gradient_accumulation_steps=g * p // mb,
        num_generations=g, max_completion_length=max_new_tokens(cfg), temperature=cfg.temperature,
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group", num_iterations=1,
        importance_sampling_level="token", mask_truncated_completions=False, shuffle_dataset=False,
        logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        remove_unused_columns=False, log_completions=False, activation_checkpointing=cfg.trl_gradient_checkpointing,
    )


# -- results ---------------------------------------------------------------------------------------

def summarize(cfg: TRLBenchConfig, seeds: dict) -> dict:
    """Per arm: mean s/step and its split, accuracy at each eval step, time to target; the ratios."""
    names = [a for a in ARMS if a in cfg.arms]
    best = [e["accuracy"] for runs in seeds.values() for name in names
            for e in [max(runs[name]["evals"], key=lambda e: e["accuracy"])]]
    target = cfg.target if cfg.target is not None else min(best)
    out: dict = {"target": target, "target_rule": "set" if cfg.target is not None
                 else "min over seeds and arms of the best accuracy"}
    for name in names:
        runs = [seeds[s][name] for s in seeds]
        steps = [r for run in runs for r in run["steps"]]
        arm = {k: sum(r[k] for r in steps) / len(steps) for k in ("loop", *PHASES, "step", "length", "zero_signal")}
        arm["accuracy_at"] = {e["step"]: _mean([next(x["accuracy"] for x in run["evals"] if x["step"] == e["step"])
                                                for run in runs]) for e in runs[0]["evals"]}
        hits = [next((e for e in run["evals"] if e["accuracy"] >= target), None) for run in runs]
        arm["to_target_seconds"] = [h["train_seconds"] if h else None for h in hits]
        arm["to_target_steps"] = [h["step"] if h else None for h in hits]
        arm["per_seed_loop"] = [_mean([r["loop"] for r in run["steps"]]) for run in runs]
        arm["precision"] = runs[0].get("precision")  # the same every seed (one CPU, one setting)
        out[name] = arm
    if set(names) == set(ARMS):
        r, t = out["rollwise"], out["trl"]
        out["step_ratio"] = t["loop"] / r["loop"]
        out["step_ratio_per_seed"] = [b / a for a, b in zip(r["per_seed_loop"], t["per_seed_loop"])]
        out["phase_ratio"] = {k: t[k] / r[k] if r[k] else None for k in ("generate", "update")}
        pairs = [(a, b) for a, b in zip(r["to_target_seconds"], t["to_target_seconds"]) if a and b]
        out["to_target_ratio_per_seed"] = [b / a for a, b in pairs]
        out["to_target_ratio"] = sum(b for _, b in pairs) / sum(a for a, _ in pairs) if pairs else None
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def print_results(console, cfg: TRLBenchConfig, out: dict) -> None:
    s, names = out["summary"], [a for a in ARMS if a in cfg.arms]

    def listed(xs, fmt):
        return ", ".join("-" if x is None else fmt(x) for x in xs)

    console.print(table(
        f"rollwise vs TRL GRPOTrainer, {cfg.workload} workload: seconds per step (mean of {cfg.steps} steps x "
        f"{len(cfg.seeds)} seeds, lockstep)",
        ("arm", "precision", "s/step", "generate", "score", "update", "other", "completion tokens",
         "zero-signal groups", "to target (s)", "steps"),
        [[name, precision_label(a["precision"]), f"{a['loop']:.2f}", *(f"{a[k]:.2f}" for k in PHASES),
          f"{a['length']:.0f}", f"{a['zero_signal']:.0%}", listed(a["to_target_seconds"], lambda x: f"{x:.0f}"),
          listed(a["to_target_steps"], str)]
         for name, a in ((n, s[n]) for n in names)]))
    console.print(table(f"greedy accuracy at equal steps (mean over seeds, {cfg.eval_size} held-out prompts)",
                        ("arm", *map(str, s[names[0]]["accuracy_at"])),
                        [[name, *(f"{v:.1%}" for v in s[name]["accuracy_at"].values())] for name in names]))
    console.print(f"target accuracy {s['target']:.1%} ({s['target_rule']})")
    if (s.get("rollwise") or {}).get("precision"):
        reason = s["rollwise"]["precision"]["engine_dtype_reason"]
        console.print(f"precision={cfg.precision}: rollwise's engine {reason}", highlight=False)
    if "step_ratio" in s:
        ratio = "n/a" if s["to_target_ratio"] is None else f"{s['to_target_ratio']:.2f}x"
        console.print(f"TRL / rollwise: {s['step_ratio']:.2f}x per step (per seed: "
                      f"{', '.join(f'{x:.2f}' for x in s['step_ratio_per_seed'])}); generate "
                      + ", update ".join("n/a" if x is None else f"{x:.2f}x" for x in s["phase_ratio"].values())
                      + f"; time to target {ratio}")
    for seed, runs in out["seeds"].items():
        if "rollwise" in runs:
            common = {e["step"]: e["accuracy"] for e in runs["rollwise"]["evals"]}
            console.print(f"seed {seed}: rollwise's own evaluator " + ", ".join(
                f"step {e['step']} {e['accuracy']:.1%} (common {common.get(e['step'], float('nan')):.1%})"
                for e in runs["rollwise"]["own_evals"]))
