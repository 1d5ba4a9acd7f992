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

The ``real`` arm (issue 21, not in the default ``arms``) runs the update on the real model
(``model_path``, SmolLM2-135M-Instruct by default): full fine-tuning vs LoRA, FLOP utilisation on
real sampled chat rollouts and peak RSS, each arm in a fresh process: ``bench/update_real.py``.
"""

from __future__ import annotations

import tempfile
import json
import subprocess
import sys
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.chat import SMOLLM2
from rollwise.bench.engine import _quiet_transformers
from rollwise.config import StrictModel, apply_overrides, validate


class UpdateBenchConfig(StrictModel):
    """Settings of ``rollwise bench update`` (override with ``--set key=value``)."""

    recipe: str | None = Field("recipes/demo.yaml", description="the recipe both arms run (null = defaults)")
    overrides: list[str] = Field([], description="extra key=value overrides for the recipe")
    steps: int = Field(40, ge=1, description="training steps per arm")
    seed: int = Field(0, description="run seed of both arms")
    threads: int = Field(1, ge=0, description="torch threads (0 = the recipe's); 1 is steadiest on shared machines")
    arms: list[Literal["skip", "forward", "throughput", "shared", "memory", "real"]] = Field(
        ["skip", "forward", "throughput", "shared", "memory"], min_length=1, description="what to run (real: the "
        "real model, full fine-tuning vs LoRA; not by default)")
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
    rows: int = Field(8, ge=1, description="memory arm: sequences in the update batch (one micro-batch; 16 rows of 256 take ~15 GB with whole logits)")
    width: int = Field(256, ge=4, description="memory arm: tokens per sequence")
    budget_mb: float = Field(512, gt=0, description="memory arm: optim.logits_budget_mb of the chunked run")
    model_path: str = Field(SMOLLM2, description="real arm: the model (a GGUF, pkg: path or HF directory)")
    real_prompts: int = Field(8, ge=1, description="real arm: chat prompts in the batch")
    real_group: int = Field(8, ge=1, description="real arm: completions sampled per prompt")
    real_max_new_tokens: int = Field(64, ge=1, description="real arm: completion limit of the sampling")
    real_temperature: float = Field(0.7, gt=0, description="real arm: sampling temperature")
    real_micro_batch: int = Field(16, ge=1, description="real arm: rollouts per forward/backward")
    real_repeats: int = Field(3, ge=2, description="real arm: updates per arm (the first, a warm-up, not counted)")
    real_lora_rank: int = Field(8, ge=1, description="real arm: LoRA rank (model.lora's other defaults)")


def run_update_bench(overrides: list[str], console) -> dict:
    cfg = validate(UpdateBenchConfig, apply_overrides({}, list(overrides)))
    out = {"settings": cfg.model_dump()}
    for arm in ("skip", "forward"):
        if arm in cfg.arms:
            with _quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
                out[arm] = _run(cfg, PAIRED[arm], Path(tmp), console)
            _print(console, out[arm])
    if "throughput" in cfg.arms:
        with _quiet_transformers(), torch.random.fork_rng():
            out["throughput"] = _throughput(cfg, console)
        _print_throughput(console, out["throughput"])
    if "shared" in cfg.arms:
        with _quiet_transformers(), torch.random.fork_rng():
            out["shared"] = _shared(cfg, console)
        _print_shared(console, cfg, out["shared"])
    if "memory" in cfg.arms:
        with console.status("memory arm: one update, whole logits vs chunked LM head"):
            out["memory"] = {name: _measure_in_child(cfg, budget, packed) for name, budget, packed in
                             (("whole", None, False), ("chunked", cfg.budget_mb, False),
                              ("chunked_packed", cfg.budget_mb, True))}
        _print_memory(console, cfg, out["memory"])
    if "real" in cfg.arms:
        from rollwise.bench.update_real import print_real, run_real

        with _quiet_transformers(), torch.random.fork_rng():
            out["real"] = run_real(cfg, console)
        print_real(console, cfg, out["real"])
    return out


# the paired arms: (setting, value of arm A, value of arm B); A is the default
PAIRED = {"skip": ("optim.skip_zero_advantage", "true", "false"), "forward": ("optim.forward", "packed", "hf")}


def _run(cfg: UpdateBenchConfig, paired: tuple[str, str, str], tmp: Path, console) -> dict:
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    key, *values = paired
    base = [f"output_dir={tmp}", f"seed={cfg.seed}", "train.checkpoint_every=0", "train.eval_every=0",
            *([f"model.threads={cfg.threads}"] if cfg.threads else []), *cfg.overrides]
    with console.status("SFT warm start"):
        with Trainer(load_run_config(cfg.recipe, [*base, "name=warm", "train.steps=0"])) as warm:
            warm.prepare()
            warm_dir = warm.init_model_dir()
    arms = {}
    for value in values:
        arms[value] = Trainer(load_run_config(cfg.recipe, [*base, f"name=arm_{value}", f"model.path={warm_dir}",
                                                           "sft.steps=0", f"{key}={value}"]))
        arms[value].prepare()
    rows: dict[str, list[dict]] = {v: [] for v in values}
    with console.status("update arms") as status:
        for step in range(cfg.steps):
            for value in (values if step % 2 == 0 else values[::-1]):  # alternate who goes first
                status.update(f"step {step + 1}/{cfg.steps}, {key}={value}")
                rows[value].append(arms[value].step())
    for t in arms.values():
        t.close()

    def mean(value, k):
        return sum(m[k] for m in rows[value]) / len(rows[value])

    a, b = values
    out = {"setting": key, "values": values, "torch_threads": torch.get_num_threads()}
    for value in values:
        out[value] = {k: mean(value, k) for k in ("time/update", "time/generate", "time/score", "time/step",
                                                   "update/skipped_rows", "groups/zero_signal", "reward/mean")}
    out["update_time_ratio"] = out[a]["time/update"] / out[b]["time/update"]
    out["step_time_ratio"] = out[a]["time/step"] / out[b]["time/step"]
    # the two arms train identically up to float rounding; report how far their losses drifted
    out["max_loss_difference"] = max(abs(x["loss"] - y["loss"]) for x, y in zip(rows[a], rows[b]))
    return out


def _print(console, out: dict) -> None:
    key, (a, b) = out["setting"], out["values"]
    table = Table(title=f"policy update: {key}={a} vs {b} (the same run side by side, alternating)")
    for col in ("arm", "update s/step", "generate s/step", "step s", "rows skipped", "zero-signal groups"):
        table.add_column(col)
    for value in (a, b):
        m = out[value]
        table.add_row(f"{key}={value}", f"{m['time/update']:.3f}", f"{m['time/generate']:.3f}", f"{m['time/step']:.3f}",
                      f"{m['update/skipped_rows']:.0%}", f"{m['groups/zero_signal']:.0%}")
    console.print(table)
    console.print(f"update time ratio ({a} / {b}): {out['update_time_ratio']:.2f}×; "
                  f"step time ratio: {out['step_time_ratio']:.2f}×; "
                  f"max loss difference between the arms: {out['max_loss_difference']:.2e}")


def update_flops(model, batch) -> float:
    """FLOPs of the useful work in one forward+backward of ``batch`` (see the module docstring)."""
    head = model.get_output_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    decoder = total - embed - (0 if tied else head)  # the embedding lookup is not a matmul
    return 6.0 * (decoder * float(batch.attention_mask.sum()) + head * float(batch.completion_mask.sum()))


def task_batch(tokenizer, rows: int = 128, group: int = 8, seed: int = 0):
    """A TrainBatch of ``rows`` arith prompts with their worked solutions (the demo's lengths once
    the policy solves them), advantages ±1 by alternating groups: every row carries signal."""
    from rollwise.optim.batch import TrainBatch
    from rollwise.tasks.arith import build

    task = build(seed, 10, 1, 5, "+-")
    seqs = []
    for i in range(rows):
        p = task.train.get(i // group)
        prompt = tokenizer(p.text)["input_ids"]
        completion = tokenizer(task.demonstrate(p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append((prompt, completion))
    width = max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((rows, width), tokenizer.pad_token_id)
    attn = torch.zeros(rows, width, dtype=torch.long)
    completion = torch.zeros(rows, width - 1)
    for r, (a, b) in enumerate(seqs):
        n = len(a) + len(b)
        ids[r, :n], attn[r, :n] = torch.tensor(a + b), 1
        completion[r, len(a) - 1 : n - 1] = 1
    sign = torch.where((torch.arange(rows) // group) % 2 == 0, 1.0, -1.0)[:, None]
    return TrainBatch(input_ids=ids, attention_mask=attn, completion_mask=completion, loss_weights=completion.clone(),
                      behavior_logprobs=-2.0 * completion, advantages=sign * completion, rewards=torch.zeros(rows),
                      group_ids=torch.arange(rows) // group)


def _throughput(cfg: UpdateBenchConfig, console) -> dict:
    import time

    from rollwise.bench.engine import matmul_flops
    from rollwise.model.tiny import build_tiny
    from rollwise.optim.objective import ObjectiveConfig
    from rollwise.optim.update import policy_update

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # best against best: the matmul FLOP/s is re-measured beside every update and the highest
    # reading taken, the updates' fastest run likewise, so a busy moment lowers neither side alone
    peaks = [matmul_flops()]
    out = {"torch_threads": torch.get_num_threads(), "presets": {}}
    for preset in cfg.presets:
        model, tok = build_tiny(preset, seed=cfg.seed)
        batch = task_batch(tok)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
        flops = update_flops(model, batch)
        times: dict[str, list[float]] = {"packed": [], "hf": []}
        with console.status(f"throughput: {preset}") as status:
            for rep in range(cfg.repeats):
                for forward in (("packed", "hf") if rep % 2 == 0 else ("hf", "packed")):
                    status.update(f"throughput: {preset}, update {rep + 1}/{cfg.repeats}, forward={forward}")
                    start = time.perf_counter()
                    policy_update(model, opt, batch, ObjectiveConfig(), micro_batch_size=len(batch), num_iterations=1,
                                  max_grad_norm=1.0, max_len=96, packed=forward == "packed", share_prompts=False)
                    times[forward].append(time.perf_counter() - start)
                    peaks.append(matmul_flops(seconds=0.1))
        row = {"params": sum(p.numel() for p in model.parameters()), "rows": len(batch),
               "real_tokens": int(batch.attention_mask.sum()), "padded_tokens": batch.attention_mask.numel(),
               "scored_tokens": int(batch.completion_mask.sum()), "useful_flops": flops}
        row["times"] = times
        out["presets"][preset] = row
    out["matmul_flop_s"] = peak = max(peaks)
    for row in out["presets"].values():
        for forward, ts in row["times"].items():
            best = min(ts[1:])  # the first is a warm-up
            row[forward] = {"seconds": best, "median_seconds": sorted(ts[1:])[len(ts[1:]) // 2],
                            "flop_utilization": row["useful_flops"] / best / peak}
        row["speedup"] = row["hf"]["seconds"] / row["packed"]["seconds"]
    return out


def _print_throughput(console, out: dict) -> None:
    table = Table(title=f"one policy update of 128 rollouts (task lengths, all rows with signal); FLOP utilisation on "
                        f"real tokens vs {out['matmul_flop_s'] / 1e9:.1f} GFLOP/s fp32 matmul, "
                        f"{out['torch_threads']} thread(s)")
    for col in ("preset", "params", "real / padded tokens", "packed s (best)", "hf s (best)", "packed util", "hf util", "speedup"):
        table.add_column(col)
    for preset, r in out["presets"].items():
        table.add_row(preset, f"{r['params'] / 1e6:.1f} M", f"{r['real_tokens']:,} / {r['padded_tokens']:,}",
                      f"{r['packed']['seconds']:.3f}", f"{r['hf']['seconds']:.3f}",
                      f"{r['packed']['flop_utilization']:.1%}", f"{r['hf']['flop_utilization']:.1%}",
                      f"{r['speedup']:.2f}×")
    console.print(table)


def chat_batch(vocab: int, rows: int, group: int, prompt: int, completion: int, seed: int = 0):
    """A TrainBatch of random tokens shaped like chat rollouts: each group of ``group`` rows
    repeats one ``prompt``-token prompt before completions of ``completion`` tokens on average;
    advantages ±1 by alternating groups (every row carries signal)."""
    from rollwise.optim.batch import TrainBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, completion // 2), completion * 3 // 2 + 1, (rows,), generator=gen)
    width = prompt + int(lengths.max())
    ids = torch.randint(3, vocab, (rows, width), generator=gen)
    prompts = torch.randint(3, vocab, ((rows + group - 1) // group, prompt), generator=gen)
    ids[:, :prompt] = prompts.repeat_interleave(group, 0)[:rows]
    attn = (torch.arange(width)[None] < prompt + lengths[:, None]).long()
    completion_mask = attn[:, 1:].float()
    completion_mask[:, : prompt - 1] = 0
    sign = torch.where((torch.arange(rows) // group) % 2 == 0, 1.0, -1.0)[:, None]
    return TrainBatch(input_ids=ids * attn, attention_mask=attn, completion_mask=completion_mask,
                      loss_weights=completion_mask.clone(), behavior_logprobs=-2.0 * completion_mask,
                      advantages=sign * completion_mask, rewards=torch.zeros(rows),
                      group_ids=torch.arange(rows) // group)


def _shared(cfg: UpdateBenchConfig, console) -> dict:
    import time

    from rollwise.model.tiny import build_tiny
    from rollwise.optim.objective import ObjectiveConfig
    from rollwise.optim.update import policy_update

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = {"torch_threads": torch.get_num_threads(), "presets": {}}
    for preset in cfg.presets:
        model, tok = build_tiny(preset, seed=cfg.seed)
        batch = chat_batch(len(tok), cfg.shared_rows, cfg.shared_group, cfg.shared_prompt, cfg.shared_completion,
                           cfg.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
        times: dict[str, list[float]] = {"on": [], "off": []}
        shared = 0.0
        with console.status(f"shared prompts: {preset}") as status:
            for rep in range(cfg.repeats):
                for side in (("on", "off") if rep % 2 == 0 else ("off", "on")):  # alternate who goes first
                    status.update(f"shared prompts: {preset}, update {rep + 1}/{cfg.repeats}, share_prompts={side}")
                    start = time.perf_counter()
                    m = policy_update(model, opt, batch, ObjectiveConfig(), micro_batch_size=len(batch),
                                      num_iterations=1, max_grad_norm=1.0, max_len=2 * cfg.shared_completion,
                                      packed=True, share_prompts=side == "on")
                    times[side].append(time.perf_counter() - start)
                    shared = max(shared, m["update/prompt_tokens_shared"])
        real = int(batch.attention_mask.sum())
        row = {"rows": len(batch), "real_tokens": real, "computed_tokens_on": real - int(shared), "times": times}
        for side, ts in times.items():
            row[side] = {"seconds": min(ts[1:]), "median_seconds": sorted(ts[1:])[len(ts[1:]) // 2]}
        row["time_ratio"] = row["on"]["seconds"] / row["off"]["seconds"]  # on / off, fastest against fastest
        row["median_time_ratio"] = row["on"]["median_seconds"] / row["off"]["median_seconds"]
        out["presets"][preset] = row
    return out


def _print_shared(console, cfg: UpdateBenchConfig, out: dict) -> None:
    table = Table(title=f"one update of {cfg.shared_rows} chat-like rollouts (groups of {cfg.shared_group}, "
                        f"{cfg.shared_prompt}-token prompt, ~{cfg.shared_completion}-token completions), packed, "
                        f"share_prompts on vs off, {out['torch_threads']} thread(s)")
    for col in ("preset", "tokens computed on / off", "on s (best)", "off s (best)", "on / off (best)",
                "on / off (median)"):
        table.add_column(col)
    for preset, r in out["presets"].items():
        table.add_row(preset, f"{r['computed_tokens_on']:,} / {r['real_tokens']:,}", f"{r['on']['seconds']:.3f}",
                      f"{r['off']['seconds']:.3f}", f"{r['time_ratio']:.2f}×", f"{r['median_time_ratio']:.2f}×")
    console.print(table)


def _measure_in_child(cfg: UpdateBenchConfig, budget_mb: float | None, packed: bool) -> dict:
    """Run ``peak_update_memory`` in a fresh interpreter (peak RSS is per process)."""
    args = json.dumps({"vocab": cfg.vocab, "hidden": cfg.hidden, "rows": cfg.rows, "width": cfg.width,
                       "budget_mb": budget_mb, "threads": cfg.threads or 1,
                       "packed": packed})
    code = f"import json; from rollwise.bench.update import peak_update_memory; print(json.dumps(peak_update_memory(**json.loads({args!r}))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_update_memory(vocab: int, hidden: int, rows: int, width: int, budget_mb: float | None, threads: int,
                       packed: bool = False) -> dict:
    """Peak RSS growth (MB) of one policy update on a random Qwen2-shaped model (call in a fresh process)."""
    import time

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollwise.optim.batch import TrainBatch
    from rollwise.optim.objective import ObjectiveConfig
    from rollwise.optim.update import policy_update

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * width,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, vocab, (rows, width))
    mask = torch.zeros(rows, width - 1)
    mask[:, width // 4 :] = 1  # the last three quarters are the completion
    adv = torch.where(torch.arange(rows)[:, None] % 2 == 0, 1.0, -1.0) * mask
    batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), completion_mask=mask, loss_weights=mask.clone(),
                       behavior_logprobs=torch.full_like(mask, -12.0) * mask, advantages=adv,
                       rewards=torch.zeros(rows), group_ids=torch.arange(rows) // 4)
    # a first update allocates the optimizer state: measure the second one
    kwargs = dict(micro_batch_size=rows, num_iterations=1, max_grad_norm=1.0, max_len=width,
                  logits_budget_mb=budget_mb, packed=packed)
    policy_update(model, opt, batch, ObjectiveConfig(), **kwargs)
    before = _status_mb("VmRSS")
    try:  # restart the high-water mark here, so the first update's peak does not count (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    start = time.perf_counter()
    policy_update(model, opt, batch, ObjectiveConfig(), **kwargs)
    seconds = time.perf_counter() - start
    # VmHWM, this process's own high-water mark: ru_maxrss would also hold the RSS of the parent
    # this child was forked from (Linux keeps it across exec: a 4 GB bench process made every
    # child read 4.5 GB). The mark is synced lazily and can trail VmRSS by a few hundred KB.
    peak = max(_status_mb("VmHWM"), _status_mb("VmRSS"))
    return {"budget_mb": budget_mb, "packed": packed, "peak_mb": peak, "before_mb": before, "update_peak_mb": peak - before,
            "seconds": seconds, "params": sum(p.numel() for p in model.parameters())}


def _status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _print_memory(console, cfg: UpdateBenchConfig, mem: dict) -> None:
    table = Table(title=f"one policy update, vocabulary {cfg.vocab:,}, {cfg.rows} × {cfg.width} tokens")
    for col in ("logits", "peak RSS growth MB", "update s"):
        table.add_column(col)
    for name, m in mem.items():
        label = "whole" if m["budget_mb"] is None else f"chunked ({m['budget_mb']:.0f} MB budget)"
        label += ", packed forward" if m.get("packed") else ", HF forward"
        table.add_row(label, f"{m['update_peak_mb']:.0f}", f"{m['seconds']:.2f}")
    console.print(table)
