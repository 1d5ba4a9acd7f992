"""``rollwise bench update --set arms=[real]``: the policy update on the real model, full fine-tuning vs LoRA.

Issue 21 asks what an update costs on SmolLM2-135M-Instruct (``model_path``, through rollwise's
loader), not on the tiny presets. One batch of real chat rollouts is made once, in this
process: ``real_prompts`` chain_sum chat prompts (``bench/chat.py``, the ``smollm2`` workload's
prompts through the chat template) x ``real_group`` completions the model itself samples with
rollwise's engine (``real_temperature``, at most ``real_max_new_tokens``, stopped at EOS);
advantages ±1 by alternating groups, so every row is trained. Then each arm — ``full`` (every
parameter trained, AdamW over all of them) and ``lora`` (rollwise's default adapters,
``model.lora`` with rank ``real_lora_rank``: AdamW over the adapters only) — runs in a fresh
interpreter of its own: load the model, then ``real_repeats`` updates of that batch (micro-batches
of ``real_micro_batch``, packed forward, shared prompts: rollwise's defaults), the first a warm-up
that allocates the optimizer state, not timed.

Per arm:

- **Peak RSS**: the child's own high-water mark (``VmHWM``, restarted once the model is loaded, so
  a loader's transient copies do not count) after the updates: the model, gradients, the optimizer
  state and the update's activations. Each arm in its own process, so neither pollutes the other's
  peak (``ru_maxrss`` would also carry the parent's: Linux keeps it across ``exec``).
- **FLOP utilisation** on real work: 4 × (the decoder's parameters × the tokens the forward
  computed + the LM head's × the completion tokens it scored) for the forward and the gradient
  through every layer, + 2 × the *trained* parameters × the same tokens for their weight gradients
  (full: all of them, so 6×, as ``update_flops`` counts; LoRA: the adapters only, the frozen base
  needs no weight gradient). Tokens computed = real tokens minus the prompt tokens shared
  (``update/prompt_tokens_shared``); padding and attention scores do not count. Divided by the
  fastest timed update and the best fp32 square-matmul reading of both children (re-measured beside
  every update), as ``bench engine`` and the ``throughput`` arm report it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch

from rollwise.bench.harness import in_child, table

REAL_ARMS = ("full", "lora")


def sampled_batch(model, tok, prompts: list[list[int]], group: int, max_new_tokens: int, temperature: float,
                  seed: int = 0):
    """A TrainBatch of ``group`` completions per prompt sampled by the model (rollwise's engine),
    advantages ±1 by alternating groups (every row carries signal)."""
    from rollwise.bench.update_cost import signal_batch
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams
    from rollwise.engine.slots import SlotEngine

    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=len(prompts) * group, seed=seed)
    requests = [Request(p, SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                          stop_token_ids=(tok.eos_token_id,), seed=seed * 100_000 + i))
                for i, p in enumerate(p for p in prompts for _ in range(group))]
    return signal_batch([(c.prompt_ids, c.token_ids) for c in engine.generate(requests)], tok.pad_token_id, group)


def trained_flops(model, batch, computed_tokens: float) -> float:
    """FLOPs of the useful work of one update (module docstring): 4 × all weights + 2 × trained weights."""
    head_w, embed_w = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    tied = head_w is embed_w
    params = list(model.parameters())
    decoder = sum(p.numel() for p in params) - embed_w.numel() - (0 if tied else head_w.numel())
    trained = sum(p.numel() for p in params if p.requires_grad and p is not head_w and p is not embed_w)
    head, scored = head_w.numel(), float(batch.completion_mask.sum())
    head_trained = head if head_w.requires_grad else 0
    return 4.0 * (decoder * computed_tokens + head * scored) + 2.0 * (trained * computed_tokens + head_trained * scored)


def real_update(model_path: str, batch_path: str, lora: bool, lora_rank: int, threads: int, repeats: int,
                micro_batch_size: int, max_len: int) -> dict:
    """One arm, in a fresh process: load the model (LoRA or not), ``repeats`` updates of the saved batch."""
    from rollwise.bench.chat import load_chat_model
    from rollwise.bench.engine import matmul_flops
    from rollwise.bench.update_cost import timed_update, best_of, restart_peak, status_mb
    from rollwise.model.lora import LoraConfig, apply_lora
    from rollwise.optim.batch import TrainBatch

    torch.set_num_threads(threads)
    model, _ = load_chat_model(model_path)
    if lora:
        model = apply_lora(model, LoraConfig(r=lora_rank), seed=0)
    batch = TrainBatch(**torch.load(batch_path))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-7)
    loaded = status_mb("VmRSS")
    restart_peak()  # the loader's transient copies are not the update's
    peaks, times, shared = [matmul_flops()], [], 0.0
    for _ in range(repeats):
        seconds, m = timed_update(model, opt, batch, micro_batch_size=micro_batch_size, max_len=max_len, packed=True)
        times.append(seconds)
        shared = max(shared, m.get("update/prompt_tokens_shared", 0.0))
        peaks.append(matmul_flops(seconds=0.1))
    computed = float(batch.attention_mask.sum()) - shared
    return {"lora": lora, "loaded_mb": loaded, "peak_mb": max(status_mb("VmHWM"), status_mb("VmRSS")),
            "times": times, **best_of(times), "matmul_flop_s": max(peaks), "computed_tokens": computed,
            "useful_flops": trained_flops(model, batch, computed), "params": sum(p.numel() for p in model.parameters()),
            "trained_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def run_real(cfg, console) -> dict:
    """Sample the batch here, then each arm in a fresh interpreter; utilisation against the best matmul."""
    from rollwise.bench.chat import chat_prompt_ids, load_chat_model

    threads = cfg.threads or 1
    torch.set_num_threads(threads)
    with console.status(f"real model: sampling {cfg.real_prompts} x {cfg.real_group} rollouts") as status, \
            tempfile.TemporaryDirectory() as tmp:
        model, tok = load_chat_model(cfg.model_path, seed=cfg.seed)
        prompts = chat_prompt_ids(tok, cfg.real_prompts, seed=cfg.seed)
        batch = sampled_batch(model, tok, prompts, cfg.real_group, cfg.real_max_new_tokens, cfg.real_temperature,
                              cfg.seed)
        del model
        path = Path(tmp) / "batch.pt"
        torch.save(dataclasses.asdict(batch), path)
        out = {"model_path": cfg.model_path, "torch_threads": threads, "rows": len(batch),
               "real_tokens": int(batch.attention_mask.sum()), "scored_tokens": int(batch.completion_mask.sum()),
               "prompt_tokens": int(batch.attention_mask.sum() - batch.completion_mask.sum()), "arms": {}}
        for arm in REAL_ARMS:
            status.update(f"real model: {arm}, {cfg.real_repeats} updates in a fresh process")
            out["arms"][arm] = in_child("rollwise.bench.update_real:real_update", {
                "model_path": cfg.model_path, "batch_path": str(path), "lora": arm == "lora",
                "lora_rank": cfg.real_lora_rank, "threads": threads, "repeats": cfg.real_repeats,
                "micro_batch_size": cfg.real_micro_batch, "max_len": cfg.real_max_new_tokens})
    out["matmul_flop_s"] = peak = max(a["matmul_flop_s"] for a in out["arms"].values())
    for a in out["arms"].values():
        a["flop_utilization"] = a["useful_flops"] / a["seconds"] / peak
        a["computed_tokens_per_s"] = a["computed_tokens"] / a["seconds"]
    full, lora = out["arms"]["full"], out["arms"]["lora"]
    out["lora_vs_full"] = {"peak_mb": lora["peak_mb"] / full["peak_mb"], "seconds": lora["seconds"] / full["seconds"]}
    return out


def print_real(console, cfg, out: dict) -> None:
    console.print(table(
        f"one policy update on {out['model_path']}: {out['rows']} sampled chat rollouts ({out['real_tokens']:,} real "
        f"tokens, {out['scored_tokens']:,} completion), micro-batches of {cfg.real_micro_batch}; each arm in a fresh "
        f"process, {out['torch_threads']} thread(s), matmul {out['matmul_flop_s'] / 1e9:.1f} GFLOP/s",
        ("arm", "trained params", "tokens computed", "update s (best)", "(median)", "FLOP util", "RSS after load MB",
         "peak RSS MB"),
        [[arm, f"{a['trained_params'] / 1e6:.2f} M", f"{a['computed_tokens']:,.0f}", f"{a['seconds']:.2f}",
          f"{a['median_seconds']:.2f}", f"{a['flop_utilization']:.1%}", f"{a['loaded_mb']:,.0f}",
          f"{a['peak_mb']:,.0f}"]
         for arm, a in out["arms"].items()]))
    r = out["lora_vs_full"]
    console.print(f"LoRA / full: peak RSS {r['peak_mb']:.2f}x, update time {r['seconds']:.2f}x")
