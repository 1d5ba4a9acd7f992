"""``rollwise bench update``: what the policy update costs, and what each of its levers saves.

Paired arms (``skip``, ``forward``): two trainers with the same recipe, seed and warm start,
differing in one setting — ``optim.skip_zero_advantage`` true/false, ``optim.forward``
packed/hf — take ``steps`` training steps in turn, in one process (alternating who goes
first, so a change in the machine's load hits both alike). Neither setting changes a number
of the update (``tests/test_loop.py``, ``tests/test_update_packed.py`` check the gradients are
equal), so the two runs train the same way and differ only in what the update runs.
Reported per arm: mean ``time/update``, ``time/generate`` and ``time/step``; the share of
rows skipped and of zero-signal groups; the ratio of update times, measured side by side.

The ``throughput`` arm measures the update alone, for each model preset: one batch of 128
rollouts whose lengths are the task's own (``arith`` prompts and their worked solutions, as
the demo samples them once warm), every row with signal, updated ``repeats`` times by the
packed and the HF forward in turn. Its FLOP utilisation counts only real work: 6 × the
decoder's parameters × the real (unpadded) tokens of the trained rows + 6 × the LM head's
parameters × the completion tokens it scores — padding, skipped rows, the head on prompt
positions and attention scores do not count — divided by the update's wall time and the
machine's fp32 matmul FLOP/s (a square matmul at the same thread count, as ``bench engine``
reports it). Best against best: the matmul is re-measured beside every update and its
highest reading is the machine's limit; the update's time is its fastest run (the median is
kept too), so a busy moment on a shared machine lowers neither side alone. Its packed forward
lays every row out whole (``share_prompts=False``), so its utilisation counts work it did.

The ``shared`` arm measures shared-prompt packing (``optim.share_prompts``) on chat-like rows:
groups of ``shared_group`` rollouts repeat one ``shared_prompt``-token prompt before short
completions (``shared_completion`` tokens on average), as a chat template does; one update of
the whole batch, packed with shared prompts on and off in turn, ``repeats`` times per preset.
Reported: the tokens each side computes, the fastest and median update, and their ratio.

The ``memory`` arm measures the peak memory of one policy update on a large-vocabulary model
(a Qwen2-shaped random model built locally, 151,936 tokens by default) with the whole logits
and with the chunked LM head (``optim.logits_budget_mb``), with the HF and the packed forward
(which sends only completion positions through the head): each in a fresh process, peak RSS
after the update minus the RSS before it, so the model's own weights do not count.

The ``dtype`` arm (issue 34, not in the default ``arms``) runs the ``throughput`` arm's update
with ``optim.compute_dtype`` float32 and bfloat16 in turn, each side's FLOP utilisation against
the square-product peak of its own dtype: ``bench/update_dtype.py``.

The ``real`` arm (issue 21, not in the default ``arms``) runs the update on the real model
(``model_path``, SmolLM2-135M-Instruct by default): full fine-tuning vs LoRA, FLOP utilisation on
real sampled chat rollouts and peak RSS, each arm in a fresh process: ``bench/update_real.py``.
The ``throughput``, ``shared`` and ``memory`` arms: ``bench/update_cost.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench import update_cost
from rollwise.bench.chat import SMOLLM2
from rollwise.bench.harness import load_settings, session, table, warm_start
from rollwise.config import StrictModel


class UpdateBenchConfig(StrictModel):
    """Settings of ``rollwise bench update`` (override with ``--set key=value``)."""

    recipe: str | None = Field("recipes/demo.yaml", description="the recipe both arms run (null = defaults)")
    overrides: list[str] = Field([], description="extra key=value overrides for the recipe")
    steps: int = Field(40, ge=1, description="training steps per arm")
    seed: int = Field(0, description="run seed of both arms")
    threads: int = Field(1, ge=0, description="torch threads (0 = the recipe's); 1 is steadiest on shared machines")
    arms: list[Literal["skip", "forward", "throughput", "shared", "memory", "dtype", "real"]] = Field(
        ["skip", "forward", "throughput", "shared", "memory"], min_length=1, description="what to run (dtype: the "
        "update in fp32 vs bf16 compute, not by default: bf16 is several times slower without native bf16; real: "
        "the real model, full fine-tuning vs LoRA, not by default)")
    presets: list[str] = Field(["tiny", "medium"], min_length=1, description="throughput arm: model presets")
    repeats: int = Field(8, ge=2, description="throughput and shared arms: updates per side and preset (the "
                         "first of each is a warm-up and not counted)")
    shared_rows: int = Field(64, ge=2, description="shared arm: rollouts in the update batch (one micro-batch)")
    shared_group: int = Field(8, ge=1, description="shared arm: rollouts per prompt")
    shared_prompt: int = Field(50, ge=1, description="shared arm: prompt tokens (SmolLM2's chat template: ~50)")
    shared_completion: int = Field(15, ge=2, description="shared arm: mean completion tokens (uniform in "
                                   "[c/2, 3c/2])")
    vocab: int = Field(151_936, ge=2, description="memory arm: vocabulary of the random Qwen2-shaped model")
    hidden: int = Field(256, ge=8, description="memory arm: hidden size (the LM head dominates at a large vocabulary)")
    rows: int = Field(8, ge=1, description="memory arm: sequences in the update batch (one micro-batch; 16 rows of "
                      "256 take ~15 GB with whole logits)")
    width: int = Field(256, ge=4, description="memory arm: tokens per sequence")
    budget_mb: float = Field(512, gt=0, description="memory arm: optim.logits_budget_mb of the chunked run")
    dtype_models: list[str] = Field(["tiny", "medium"], min_length=1, description="dtype arm: tiny presets, or "
                                    "'real' for model_path")
    dtype_rows: int = Field(128, ge=2, description="dtype arm: rollouts in the update batch (one micro-batch)")
    matmul_size: int = Field(1024, ge=16, description="dtype arm: side of the square product each dtype's FLOP/s "
                             "reference times (a bf16 one takes seconds on a CPU without native bf16)")
    model_path: str = Field(SMOLLM2, description="real and dtype arms: the model (a GGUF, pkg: path or HF directory)")
    real_prompts: int = Field(8, ge=1, description="real arm: chat prompts in the batch")
    real_group: int = Field(8, ge=1, description="real arm: completions sampled per prompt")
    real_max_new_tokens: int = Field(64, ge=1, description="real arm: completion limit of the sampling")
    real_temperature: float = Field(0.7, gt=0, description="real arm: sampling temperature")
    real_micro_batch: int = Field(16, ge=1, description="real arm: rollouts per forward/backward")
    real_repeats: int = Field(3, ge=2, description="real arm: updates per arm (the first, a warm-up, not counted)")
    real_lora_rank: int = Field(8, ge=1, description="real arm: LoRA rank (model.lora's other defaults)")


def run_update_bench(overrides: list[str], console) -> dict:
    cfg = load_settings(UpdateBenchConfig, overrides)
    out = {"settings": cfg.model_dump()}
    for arm in ("skip", "forward"):
        if arm in cfg.arms:
            with session() as tmp:
                out[arm] = _paired(cfg, PAIRED[arm], tmp, console)
            _print(console, out[arm])
    if "throughput" in cfg.arms:
        with session():
            out["throughput"] = update_cost.throughput(cfg, console)
        update_cost.print_throughput(console, out["throughput"])
    if "shared" in cfg.arms:
        with session():
            out["shared"] = update_cost.shared(cfg, console)
        update_cost.print_shared(console, cfg, out["shared"])
    if "memory" in cfg.arms:
        with console.status("memory arm: one update, whole logits vs chunked LM head"):
            out["memory"] = update_cost.memory(cfg)
        update_cost.print_memory(console, cfg, out["memory"])
    if "dtype" in cfg.arms:
        from rollwise.bench.update_dtype import dtype_arm, print_dtype

        with session():
            out["dtype"] = dtype_arm(cfg, console)
        print_dtype(console, out["dtype"])
    if "real" in cfg.arms:
        from rollwise.bench.update_real import print_real, run_real

        with session():
            out["real"] = run_real(cfg, console)
        print_real(console, cfg, out["real"])
    return out


# the paired arms: (setting, value of arm A, value of arm B); A is the default
PAIRED = {"skip": ("optim.skip_zero_advantage", "true", "false"), "forward": ("optim.forward", "packed", "hf")}


def _paired(cfg: UpdateBenchConfig, paired: tuple[str, str, str], tmp: Path, console) -> dict:
    """Two trainers from one warm start, differing in one setting, step by step in turn."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    key, *values = paired
    base = [f"output_dir={tmp}", f"seed={cfg.seed}", "train.checkpoint_every=0", "train.eval_every=0",
            *([f"model.threads={cfg.threads}"] if cfg.threads else []), *cfg.overrides]
    warm = warm_start(tmp, "warm", base, console, recipe=cfg.recipe)
    arms, rows = {}, {v: [] for v in values}
    try:
        for value in values:
            arms[value] = Trainer(load_run_config(cfg.recipe, [*base, f"name=arm_{value}", f"model.path={warm}",
                                                               "sft.steps=0", f"{key}={value}"]))
            arms[value].prepare()
        with console.status("update arms") as status:
            for step in range(cfg.steps):
                for value in (values if step % 2 == 0 else values[::-1]):  # alternate who goes first
                    status.update(f"step {step + 1}/{cfg.steps}, {key}={value}")
                    rows[value].append(arms[value].step())
    finally:
        for t in arms.values():
            t.close()
    a, b = values
    out = {"setting": key, "values": values, "torch_threads": torch.get_num_threads()}
    for value in values:
        out[value] = {k: sum(m[k] for m in rows[value]) / len(rows[value])
                      for k in ("time/update", "time/generate", "time/score", "time/step", "update/skipped_rows",
                                "groups/zero_signal", "reward/mean")}
    out["update_time_ratio"] = out[a]["time/update"] / out[b]["time/update"]
    out["step_time_ratio"] = out[a]["time/step"] / out[b]["time/step"]
    # the two arms train identically up to float rounding; report how far their losses drifted
    out["max_loss_difference"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(rows[a], rows[b]))
    return out


def _print(console, out: dict) -> None:
    key, (a, b) = out["setting"], out["values"]
    console.print(table(
        f"policy update: {key}={a} vs {b} (the same run side by side, alternating)",
        ("arm", "update s/step", "generate s/step", "step s", "rows skipped", "zero-signal groups"),
        [[f"{key}={v}", f"{m['time/update']:.3f}", f"{m['time/generate']:.3f}", f"{m['time/step']:.3f}",
          f"{m['update/skipped_rows']:.0%}", f"{m['groups/zero_signal']:.0%}"]
         for v, m in ((v, out[v]) for v in (a, b))]))
    console.print(f"update time ratio ({a} / {b}): {out['update_time_ratio']:.2f}×; "
                  f"step time ratio: {out['step_time_ratio']:.2f}×; "
                  f"max loss difference between the arms: {out['max_loss_difference']:.2e}")
