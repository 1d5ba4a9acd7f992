"""``rollwise bench update``'s arms that time the update alone, on a batch made here:
``throughput`` (FLOP utilisation of the packed and the HF forward), ``shared`` (shared-prompt
packing on chat-like rows) and ``memory`` (peak RSS with whole logits and with the chunked LM head,
each in a fresh process). How each is measured: ``bench/update.py``'s docstring.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rollwise.bench.harness import in_child, table


def signal_batch(seqs: list[tuple[list[int], list[int]]], pad_id: int, group: int):
    """A TrainBatch of (prompt ids, completion ids) rows, right-padded, advantages ±1 by alternating
    groups of ``group`` rows: every row carries signal, none is skipped."""
    from rollwise.optim.batch import TrainBatch

    rows, width = len(seqs), max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((rows, width), pad_id)
    attn = torch.zeros(rows, width, dtype=torch.long)
    completion = torch.zeros(rows, width - 1)
    for r, (a, b) in enumerate(seqs):
        n = len(a) + len(b)
        ids[r, :n], attn[r, :n] = torch.tensor(list(a) + list(b)), 1
        completion[r, len(a) - 1 : n - 1] = 1
    sign = torch.where((torch.arange(rows) // group) % 2 == 0, 1.0, -1.0)[:, None]
    return TrainBatch(input_ids=ids, attention_mask=attn, completion_mask=completion, loss_weights=completion.clone(),
                      behavior_logprobs=-2.0 * completion, advantages=sign * completion, rewards=torch.zeros(rows),
                      group_ids=torch.arange(rows) // group)


def task_batch(tokenizer, rows: int = 128, group: int = 8, seed: int = 0):
    """``rows`` arith prompts with their worked solutions (the demo's lengths once the policy solves
    them), as a ``signal_batch``."""
    from rollwise.tasks.arith import build

    task = build(seed, 10, 1, 5, "+-")
    seqs = []
    for i in range(rows):
        p = task.train.get(i // group)
        completion = tokenizer(task.demonstrate(p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append((tokenizer(p.text)["input_ids"], completion))
    return signal_batch(seqs, tokenizer.pad_token_id, group)


def update_flops(model, batch) -> float:
    """FLOPs of the useful work in one forward+backward of ``batch`` (``bench/update.py``'s docstring)."""
    head = model.get_output_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    decoder = total - embed - (0 if tied else head)  # the embedding lookup is not a matmul
    return 6.0 * (decoder * float(batch.attention_mask.sum()) + head * float(batch.completion_mask.sum()))


def best_of(times: list[float]) -> dict:
    """The fastest and the median of timed runs, the first (a warm-up) left out."""
    timed = sorted(times[1:])
    return {"seconds": timed[0], "median_seconds": timed[len(timed) // 2]}


def timed_update(model, opt, batch, **spec) -> tuple[float, dict]:
    from rollwise.optim.config import ObjectiveConfig
    from rollwise.optim.update import UpdateSpec, policy_update

    start = time.perf_counter()
    metrics = policy_update(model, opt, batch, UpdateSpec(ObjectiveConfig(), passes=1, max_grad_norm=1.0, **spec))
    return time.perf_counter() - start, metrics


def throughput(cfg, console) -> dict:
    """Per preset: ``repeats`` updates of one task batch by the packed and the HF forward in turn;
    best against best — the matmul FLOP/s re-measured beside every update, its highest reading the
    machine's limit, the updates' fastest run likewise — so a busy moment lowers neither side alone."""
    from rollwise.bench.engine import matmul_flops
    from rollwise.model.tiny import build_tiny

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    peaks = [matmul_flops()]
    out = {"torch_threads": torch.get_num_threads(), "presets": {}}
    for preset in cfg.presets:
        model, tok = build_tiny(preset, seed=cfg.seed)
        batch = task_batch(tok)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
        times: dict[str, list[float]] = {"packed": [], "hf": []}
        with console.status(f"throughput: {preset}") as status:
            for rep in range(cfg.repeats):
                for forward in (("packed", "hf") if rep % 2 == 0 else ("hf", "packed")):
                    status.update(f"throughput: {preset}, update {rep + 1}/{cfg.repeats}, forward={forward}")
                    times[forward].append(timed_update(model, opt, batch, micro_batch_size=len(batch), max_len=96,
                                                        packed=forward == "packed", share_prompts=False)[0])
                    peaks.append(matmul_flops(seconds=0.1))
        out["presets"][preset] = {
            "params": sum(p.numel() for p in model.parameters()), "rows": len(batch),
            "real_tokens": int(batch.attention_mask.sum()), "padded_tokens": batch.attention_mask.numel(),
            "scored_tokens": int(batch.completion_mask.sum()), "useful_flops": update_flops(model, batch),
            "times": times}
    out["matmul_flop_s"] = peak = max(peaks)
    for row in out["presets"].values():
        for forward, ts in row["times"].items():
            row[forward] = best_of(ts)
            row[forward]["flop_utilization"] = row["useful_flops"] / row[forward]["seconds"] / peak
        row["speedup"] = row["hf"]["seconds"] / row["packed"]["seconds"]
    return out


def print_throughput(console, out: dict) -> None:
    console.print(table(
        f"one policy update of 128 rollouts (task lengths, all rows with signal); FLOP utilisation on real tokens vs "
        f"{out['matmul_flop_s'] / 1e9:.1f} GFLOP/s fp32 matmul, {out['torch_threads']} thread(s)",
        ("preset", "params", "real / padded tokens", "packed s (best)", "hf s (best)", "packed util", "hf util",
         "speedup"),
        [[preset, f"{r['params'] / 1e6:.1f} M", f"{r['real_tokens']:,} / {r['padded_tokens']:,}",
          f"{r['packed']['seconds']:.3f}", f"{r['hf']['seconds']:.3f}", f"{r['packed']['flop_utilization']:.1%}",
          f"{r['hf']['flop_utilization']:.1%}", f"{r['speedup']:.2f}×"] for preset, r in out["presets"].items()]))


def chat_batch(vocab: int, rows: int, group: int, prompt: int, completion: int, seed: int = 0):
    """Random tokens shaped like chat rollouts, as a ``signal_batch``: each group of ``group`` rows
    repeats one ``prompt``-token prompt before completions of ``completion`` tokens on average."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, completion // 2), completion * 3 // 2 + 1, (rows,), generator=gen)
    ids = torch.randint(3, vocab, (rows, prompt + int(lengths.max())), generator=gen)
    prompts = torch.randint(3, vocab, ((rows + group - 1) // group, prompt), generator=gen)
    return signal_batch([(prompts[r // group].tolist(), ids[r, prompt : prompt + int(lengths[r])].tolist())
                         for r in range(rows)], 0, group)


def shared(cfg, console) -> dict:
    """Per preset: ``repeats`` packed updates of one chat-like batch, shared prompts on and off in turn."""
    from rollwise.model.tiny import build_tiny

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = {"torch_threads": torch.get_num_threads(), "presets": {}}
    for preset in cfg.presets:
        model, tok = build_tiny(preset, seed=cfg.seed)
        batch = chat_batch(len(tok), cfg.shared_rows, cfg.shared_group, cfg.shared_prompt, cfg.shared_completion,
                           cfg.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
        times: dict[str, list[float]] = {"on": [], "off": []}
        spared = 0.0
        with console.status(f"shared prompts: {preset}") as status:
            for rep in range(cfg.repeats):
                for side in (("on", "off") if rep % 2 == 0 else ("off", "on")):  # alternate who goes first
                    status.update(f"shared prompts: {preset}, update {rep + 1}/{cfg.repeats}, share_prompts={side}")
                    seconds, m = timed_update(model, opt, batch, micro_batch_size=len(batch),
                                               max_len=2 * cfg.shared_completion, packed=True,
                                               share_prompts=side == "on")
                    times[side].append(seconds)
                    spared = max(spared, m["update/prompt_tokens_shared"])
        real = int(batch.attention_mask.sum())
        row = {"rows": len(batch), "real_tokens": real, "computed_tokens_on": real - int(spared), "times": times,
               "on": best_of(times["on"]), "off": best_of(times["off"])}
        row["time_ratio"] = row["on"]["seconds"] / row["off"]["seconds"]  # on / off, fastest against fastest
        row["median_time_ratio"] = row["on"]["median_seconds"] / row["off"]["median_seconds"]
        out["presets"][preset] = row
    return out


def print_shared(console, cfg, out: dict) -> None:
    console.print(table(
        f"one update of {cfg.shared_rows} chat-like rollouts (groups of {cfg.shared_group}, {cfg.shared_prompt}-token "
        f"prompt, ~{cfg.shared_completion}-token completions), packed, share_prompts on vs off, "
        f"{out['torch_threads']} thread(s)",
        ("preset", "tokens computed on / off", "on s (best)", "off s (best)", "on / off (best)", "on / off (median)"),
        [[preset, f"{r['computed_tokens_on']:,} / {r['real_tokens']:,}", f"{r['on']['seconds']:.3f}",
          f"{r['off']['seconds']:.3f}", f"{r['time_ratio']:.2f}×", f"{r['median_time_ratio']:.2f}×"]
         for preset, r in out["presets"].items()]))


def memory(cfg) -> dict:
    """Whole logits, the chunked LM head, and the chunked head with the packed forward: each one
    update in a fresh interpreter (peak RSS is per process)."""
    return {name: _memory_in_child(cfg, budget, packed) for name, budget, packed in
            (("whole", None, False), ("chunked", cfg.budget_mb, False), ("chunked_packed", cfg.budget_mb, True))}


def _memory_in_child(cfg, budget_mb: float | None, packed: bool) -> dict:
    return in_child("rollwise.bench.update_cost:peak_update_memory", {
        "vocab": cfg.vocab, "hidden": cfg.hidden, "rows": cfg.rows, "width": cfg.width, "budget_mb": budget_mb,
        "threads": cfg.threads or 1, "packed": packed})


def peak_update_memory(vocab: int, hidden: int, rows: int, width: int, budget_mb: float | None, threads: int,
                       packed: bool = False) -> dict:
    """Peak RSS growth (MB) of one policy update on a random Qwen2-shaped model (call in a fresh process)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollwise.optim.batch import TrainBatch

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
    batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), completion_mask=mask,
                       loss_weights=mask.clone(), behavior_logprobs=torch.full_like(mask, -12.0) * mask,
                       advantages=adv, rewards=torch.zeros(rows), group_ids=torch.arange(rows) // 4)
    spec = dict(micro_batch_size=rows, max_len=width, logits_budget_mb=budget_mb, packed=packed)
    timed_update(model, opt, batch, **spec)  # a first update allocates the optimizer state: measure the second
    before = status_mb("VmRSS")
    restart_peak()  # so the first update's peak does not count
    seconds, _ = timed_update(model, opt, batch, **spec)
    # VmHWM, this process's own high-water mark: ru_maxrss would also hold the RSS of the parent
    # this child was forked from (Linux keeps it across exec: a 4 GB bench process made every
    # child read 4.5 GB). The mark is synced lazily and can trail VmRSS by a few hundred KB.
    peak = max(status_mb("VmHWM"), status_mb("VmRSS"))
    return {"budget_mb": budget_mb, "packed": packed, "peak_mb": peak, "before_mb": before,
            "update_peak_mb": peak - before, "seconds": seconds, "params": sum(p.numel() for p in model.parameters())}


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def restart_peak() -> None:
    """Restart this process's RSS high-water mark (``VmHWM``; Linux >= 4.0, else nothing)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def print_memory(console, cfg, mem: dict) -> None:
    rows = []
    for m in mem.values():
        label = "whole" if m["budget_mb"] is None else f"chunked ({m['budget_mb']:.0f} MB budget)"
        rows.append([label + (", packed forward" if m.get("packed") else ", HF forward"),
                     f"{m['update_peak_mb']:.0f}", f"{m['seconds']:.2f}"])
    console.print(table(f"one policy update, vocabulary {cfg.vocab:,}, {cfg.rows} × {cfg.width} tokens",
                        ("logits", "peak RSS growth MB", "update s"), rows))
