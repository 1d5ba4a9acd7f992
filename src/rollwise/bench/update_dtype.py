"""``rollwise bench update``'s ``dtype`` arm: the update in fp32 and with bf16 compute
(``optim.compute_dtype``), each against the matmul reference of its own dtype.

Per model (``dtype_models``: tiny presets, or ``real`` for ``model_path`` through rollwise's
loader, SmolLM2-135M-Instruct by default): one batch of ``dtype_rows`` arith rollouts at the
task's own lengths, every row with signal (``update_cost.task_batch``), updated ``repeats`` times
with ``compute_dtype`` float32 and bfloat16 in turn (alternating who goes first), one
micro-batch, the packed forward laying every row out whole — the ``throughput`` arm's update.
The useful FLOPs are ``update_flops`` (6 × parameters × real tokens, the head on completion
tokens only). Each side's FLOP utilisation divides them by its fastest update and by the best
square-product FLOP/s **of the same dtype** (``reference_flops``: ``bench/engine.py``'s
``matmul_flops(dtype)`` and the same product through ``F.linear``, the better of the two),
re-measured beside every update: fp32 against fp32's peak, bf16 against bf16's — so a machine
whose bf16 kernels are slow (no native bf16) shows a slow bf16 update at a fair utilisation, and
one with AVX-512 BF16/AMX shows what bf16 buys. Why both entry points: on this AVX2-only CPU
torch sends a bf16 ``a @ b`` to a generic kernel and a bf16 ``F.linear`` (what the update's layers
call) to oneDNN, measured 0.2–0.3 vs 1.6–2.2 GFLOP/s at 256–512 (fp32: 12–35) — ``@`` alone
would make the bf16 update look better than its own kernels allow. The ratio of update times
(fp32 / bf16, fastest against fastest) is the speed-up, measured side by side.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from rollwise.bench.harness import table

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load(name: str, cfg):
    """(model, tokenizer): a tiny preset by name, or ``real``: ``cfg.model_path`` in fp32."""
    if name == "real":
        from rollwise.bench.chat import load_chat_model

        return load_chat_model(cfg.model_path, seed=cfg.seed)
    from rollwise.model.tiny import build_tiny

    return build_tiny(name, seed=cfg.seed)


def linear_flops(dtype: torch.dtype, size: int, seconds: float) -> float:
    """The best FLOP/s of ``F.linear`` on two square ``size`` matrices over ~``seconds``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    F.linear(a, b)  # warm-up: kernel selection, page faults
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.perf_counter()
        F.linear(a, b)
        took = time.perf_counter() - start
        spent += took
        best = max(best, 2 * size**3 / took)
    return best


def reference_flops(dtype: torch.dtype, size: int, seconds: float = 0.3) -> float:
    """The machine's square-product FLOP/s in ``dtype``: the better of ``a @ b`` and ``F.linear`` (docstring)."""
    from rollwise.bench.engine import matmul_flops

    return max(matmul_flops(dtype, size, seconds / 2), linear_flops(dtype, size, seconds / 2))


def dtype_arm(cfg, console) -> dict:
    """Per model: ``repeats`` updates of one task batch in fp32 and bf16 compute, in turn; each dtype's
    matmul peak re-measured beside each of its updates, best against best (``throughput``'s rule)."""
    from rollwise.bench.update_cost import best_of, task_batch, timed_update, update_flops

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    peaks = {name: [reference_flops(dtype, cfg.matmul_size)] for name, dtype in DTYPES.items()}
    out = {"torch_threads": torch.get_num_threads(), "matmul_size": cfg.matmul_size, "models": {}}
    for name in cfg.dtype_models:
        model, tok = load(name, cfg)
        batch = task_batch(tok, rows=cfg.dtype_rows)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
        times: dict[str, list[float]] = {d: [] for d in DTYPES}
        with console.status(f"compute dtype: {name}") as status:
            for rep in range(cfg.repeats):
                for d in (tuple(DTYPES) if rep % 2 == 0 else tuple(DTYPES)[::-1]):  # alternate who goes first
                    status.update(f"compute dtype: {name}, update {rep + 1}/{cfg.repeats}, {d}")
                    seconds, _ = timed_update(model, opt, batch, micro_batch_size=len(batch), max_len=96,
                                              packed=True, share_prompts=False, compute_dtype=DTYPES[d])
                    times[d].append(seconds)
                    peaks[d].append(reference_flops(DTYPES[d], cfg.matmul_size, seconds=0.1))
        out["models"][name] = {
            "params": sum(p.numel() for p in model.parameters()), "rows": len(batch),
            "real_tokens": int(batch.attention_mask.sum()), "useful_flops": update_flops(model, batch),
            "times": times}
    out["matmul_flop_s"] = {d: max(p) for d, p in peaks.items()}
    for row in out["models"].values():
        for d, ts in row["times"].items():
            row[d] = best_of(ts)
            row[d]["flop_utilization"] = row["useful_flops"] / row[d]["seconds"] / out["matmul_flop_s"][d]
        row["bf16_speedup"] = row["float32"]["seconds"] / row["bfloat16"]["seconds"]
    return out


def print_dtype(console, out: dict) -> None:
    peak = out["matmul_flop_s"]
    console.print(table(
        f"one policy update (task lengths, all rows with signal), optim.compute_dtype float32 vs bfloat16; FLOP "
        f"utilisation against the same dtype's {out['matmul_size']}² product: fp32 {peak['float32'] / 1e9:.1f}, bf16 "
        f"{peak['bfloat16'] / 1e9:.1f} GFLOP/s, {out['torch_threads']} thread(s)",
        ("model", "params", "fp32 s (best)", "bf16 s (best)", "fp32 util", "bf16 util", "fp32 / bf16 time"),
        [[name, f"{r['params'] / 1e6:.1f} M", f"{r['float32']['seconds']:.3f}", f"{r['bfloat16']['seconds']:.3f}",
          f"{r['float32']['flop_utilization']:.1%}", f"{r['bfloat16']['flop_utilization']:.1%}",
          f"{r['bf16_speedup']:.2f}×"] for name, r in out["models"].items()]))
