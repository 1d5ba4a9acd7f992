"""``rollwise bench engine``: the embedded engine against Hugging Face ``model.generate``.

For each model (tiny presets with their random init) and each workload, both sides run the
same model object, the same tokenized prompts and the same sampling settings (plain
sampling: temperature, no top-k, no top-p), in the same process, alternating A, B, A, B...
so that drift in machine load hits both. The headline is the ratio of their *useful*
generated tokens per second; absolute numbers on a shared machine are noise (DESIGN.md,
"Measuring").

How the workloads are built, and why:

- An untrained model's lengths are arbitrary, so EOS is switched off on both sides and each
  request instead gets its own ``max_new_tokens``, drawn with a seeded RNG — the length it
  would have had if it had stopped there. Only those tokens count as useful.
- ``uniform``: ``num_prompts`` arith prompts, lengths drawn uniformly from
  ``[min_new_tokens, max_new_tokens]``.
- ``long_tail``: the same prompts; a ``long_tail_share`` of them (at least one) run
  ``long_tail_factor`` × the median length, the rest between half and 1.5× the median — a
  few completions 10× the median, as in real reasoning rollouts.
- ``fork``: one prompt → ``num_prompts`` samples with the long-tail lengths (a group of
  rollouts of one prompt varies in length the same way). The prompt carries ``fork_shots``
  worked examples before its question (~250 tokens by default): real RL prompts carry
  instructions and examples, and a shared prefix is what ``fork`` exists for; with
  ``fork_shots=0`` the workload is ``long_tail`` with one 9-token prompt. rollwise submits the prompt once
  and ``fork``s it before the first step (the prompt is prefilled once); HF samples that
  many independent copies of the prompt.
- ``chat`` (the real model, issue 21): ``num_prompts`` reasoning-gym ``chain_sum`` prompts as chat
  messages through the model's chat template (``bench/chat.py``; ~140 tokens on SmolLM2), lengths
  drawn uniformly from ``[chat_min_new_tokens, chat_max_new_tokens]`` (64-256). Its model is
  ``smollm2`` in ``models``: ``model_path`` (by default SmolLM2-135M-Instruct from the wheel's GGUF)
  through rollwise's loader, the same object for both sides. ``models=[smollm2]`` defaults to
  ``workloads=[chat]`` and ``batch_sizes=[32, 64]`` (each batch size a separate side-by-side
  measurement); a ``--set`` wins.
- HF ``generate`` has one ``max_new_tokens`` per call, so requests are cut into consecutive
  batches of ``batch_size``; each HF batch runs to its longest request and its extra tokens
  are computed but not counted. rollwise gets ``batch_size`` slots.
- ``flop_utilization`` = 2 × parameters × rollwise tokens/s ÷ the machine's fp32 matmul
  FLOP/s (a square matmul measured in this run, at the same thread count).
- Timed regions cover everything from token-id lists to generated ids on both sides. Each
  side gets one untimed warm-up run per workload. rollwise keeps one engine per workload
  across its runs, as the trainer keeps one across steps (so its KV cache is allocated in the
  warm-up; HF allocates its cache inside every ``generate`` call, which is how HF works).
  ``torch`` threads are left at their default unless ``threads`` is set: on a machine shared
  with other work, one thread is steadier (with two, a small matmul waits whenever the OS
  parks either thread).
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.chat import SMOLLM2
from rollwise.bench.harness import load_settings, session, table
from rollwise.config import ConfigError, StrictModel

WORKLOADS = ("uniform", "long_tail", "fork", "chat")
REAL_MODEL = "smollm2"  # a name in `models`: the model at `model_path`, not a tiny preset
REAL_DEFAULTS = {"workloads": ["chat"], "batch_sizes": [32, 64]}  # with models=[smollm2]; --set wins


class EngineBenchConfig(StrictModel):
    """Settings of ``rollwise bench engine`` (override with ``--set key=value``)."""

    models: list[str] = Field(["tiny", "medium"], min_length=1,
                              description="tiny model presets to benchmark (random init), in order; 'smollm2' = "
                              "the real model at model_path")
    model_path: str = Field(SMOLLM2, description="the 'smollm2' model: a GGUF, pkg: path or HF directory "
                            "(rollwise's loader)")
    workloads: list[Literal["uniform", "long_tail", "fork", "chat"]] = Field(
        list(WORKLOADS[:3]), min_length=1, description="workloads to run (chat: the real model's chat prompts)")
    batch_sizes: list[int] | None = Field(None, min_length=1, description="measure at each of these batch sizes "
                                          "(null = [batch_size])")
    chat_min_new_tokens: int = Field(64, ge=1, description="chat: smallest per-request max_new_tokens drawn")
    chat_max_new_tokens: int = Field(256, ge=1, description="chat: largest per-request max_new_tokens drawn")
    engine: Literal["slots", "v1"] = Field("slots", description="rollwise engine: slots (v2) or v1 (static batches)")
    seed: int = Field(0, ge=0, description="seeds the model init, the prompts, the length draws and sampling")
    num_prompts: int = Field(64, ge=1, description="requests per workload (for fork: children of one prompt)")
    batch_size: int = Field(64, ge=1, description="rollwise slots, and requests per HF generate call")
    min_new_tokens: int = Field(16, ge=1, description="uniform: smallest per-request max_new_tokens drawn")
    max_new_tokens: int = Field(96, ge=1, description="uniform: largest per-request max_new_tokens drawn (inclusive)")
    long_tail_median: int = Field(24, ge=2, description="long_tail/fork: typical completion length")
    long_tail_factor: float = Field(10.0, ge=1, description="long_tail/fork: long completions are this × the median")
    long_tail_share: float = Field(0.1, gt=0, le=1, description="long_tail/fork: share of long completions")
    fork_shots: int = Field(4, ge=0, description="fork: worked arith examples before the question (a few-shot "
                            "prompt of ~250 tokens, as RL prompts carry instructions); 0 = the bare ~9-token question")
    temperature: float = Field(1.0, gt=0, description="sampling temperature, the same for both sides")
    repeats: int = Field(3, ge=1, description="timed runs per side (alternating); the median is reported")
    threads: int = Field(0, ge=0, description="torch threads for both sides (0 = torch's default)")


def load_bench_config(overrides: list[str]) -> EngineBenchConfig:
    from rollwise.model.tiny import PRESETS

    cfg = load_settings(EngineBenchConfig, overrides)
    if cfg.models == [REAL_MODEL]:
        cfg = load_settings(EngineBenchConfig, overrides, REAL_DEFAULTS)
    for lo, hi in (("min_new_tokens", "max_new_tokens"), ("chat_min_new_tokens", "chat_max_new_tokens")):
        if getattr(cfg, lo) > getattr(cfg, hi):
            raise ConfigError(f"config field '{lo}' ({getattr(cfg, lo)}) must be <= '{hi}' ({getattr(cfg, hi)})")
    for name in cfg.models:
        if name not in PRESETS and name != REAL_MODEL:
            raise ConfigError(f"config field 'models': unknown preset '{name}'; choose from "
                              f"{sorted(PRESETS)} or '{REAL_MODEL}'")
    return cfg


def left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, batch))
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _batches(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def workload_lengths(cfg: EngineBenchConfig, name: str) -> list[int]:
    """Per-request ``max_new_tokens`` of workload ``name`` (seeded by ``cfg.seed`` and the name)."""
    rng = random.Random(f"bench-engine:{name}:{cfg.seed}")
    n = cfg.num_prompts
    if name == "uniform":
        return [rng.randint(cfg.min_new_tokens, cfg.max_new_tokens) for _ in range(n)]
    if name == "chat":
        return [rng.randint(cfg.chat_min_new_tokens, cfg.chat_max_new_tokens) for _ in range(n)]
    m = cfg.long_tail_median
    lengths = [rng.randint(m // 2, m * 3 // 2) for _ in range(n)]
    for i in rng.sample(range(n), max(1, round(cfg.long_tail_share * n))):
        lengths[i] = round(m * cfg.long_tail_factor * rng.uniform(0.9, 1.1))
    return lengths


def matmul_flops(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3) -> float:
    """The best FLOP/s of a square ``size`` matmul over ~``seconds`` (this thread count and dtype)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.perf_counter()
        a @ b
        took = time.perf_counter() - start
        spent += took
        best = max(best, 2 * size**3 / took)
    return best


def _make_engine(cfg, model, pad_id):
    from rollwise.engine.engine import Engine
    from rollwise.engine.slots import SlotEngine

    cls = SlotEngine if cfg.engine == "slots" else Engine
    return cls(model, pad_token_id=pad_id, max_batch_size=cfg.batch_size, seed=cfg.seed)


def _run_rollwise(cfg, engine, zero_stats, prompts, lengths, fork: bool) -> tuple[float, dict]:
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams

    engine.stats = copy.deepcopy(zero_stats)  # this run's counters only
    params = [SamplingParams(temperature=cfg.temperature, max_new_tokens=n) for n in lengths]
    start = time.perf_counter()
    if fork and cfg.engine == "slots":
        (h,) = engine.submit([Request(prompts[0], params[0])])
        engine.fork(h, len(lengths), params)  # before the first step: the prompt is prefilled once
        outs = list(engine.run_until().values())
    else:
        outs = engine.generate([Request(p, sp) for p, sp in zip(prompts, params)])
    seconds = time.perf_counter() - start
    got = sum(len(o.token_ids) for o in outs)
    if got != sum(lengths):
        raise RuntimeError(f"engine produced {got} tokens, expected {sum(lengths)} (EOS should be off)")
    return seconds, engine.stats.as_dict()


def _run_hf(cfg, model, pad_id, prompts, lengths, run: int) -> float:
    torch.manual_seed(cfg.seed * 1000 + run)  # HF samples from the global generator
    got = 0
    start = time.perf_counter()
    for b in _batches(len(prompts), cfg.batch_size):
        ids, mask = left_pad([prompts[i] for i in b], pad_id)
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0,
            max_new_tokens=max(lengths[i] for i in b), pad_token_id=pad_id, eos_token_id=None,
        )
        generated = out.shape[1] - ids.shape[1]
        got += sum(min(lengths[i], generated) for i in b)
    seconds = time.perf_counter() - start
    if got != sum(lengths):
        raise RuntimeError(f"HF generate produced {got} useful tokens, expected {sum(lengths)} (did EOS stop it?)")
    return seconds


def _bench_workload(cfg, model, tok, params_count, name, flops, status) -> dict:
    from rollwise.tasks.arith import build as build_arith

    task = build_arith(cfg.seed)
    lengths = workload_lengths(cfg, name)
    fork = name == "fork"
    if name == "chat":
        from rollwise.bench.chat import chat_prompt_ids

        prompts = chat_prompt_ids(tok, cfg.num_prompts, seed=cfg.seed)
    elif fork:
        shots = "".join(p.text + task.demonstrate(p) + "\n" for p in map(task.train.get, range(1, 1 + cfg.fork_shots)))
        prompts = [tok(shots + task.train.get(0).text)["input_ids"]] * cfg.num_prompts
    else:
        prompts = [tok(task.train.get(i).text)["input_ids"] for i in range(cfg.num_prompts)]
    longest = max(map(len, prompts)) + max(lengths)
    if longest > model.config.max_position_embeddings:
        raise ConfigError(f"{name}: prompt plus max_new_tokens reaches {longest} positions, over the model's "
                          f"{model.config.max_position_embeddings}; lower the lengths")
    useful = sum(lengths)
    hf_computed = sum(len(b) * max(lengths[i] for i in b) for b in _batches(len(prompts), cfg.batch_size))
    pad = tok.pad_token_id
    engine = _make_engine(cfg, model, pad)  # one engine for all runs, as a trainer keeps one
    zero_stats = copy.deepcopy(engine.stats)
    _run_rollwise(cfg, engine, zero_stats, prompts, lengths, fork)  # warm-up (and the cache's allocation)
    _run_hf(cfg, model, pad, prompts, lengths, 0)
    rollwise_s, hf_s, stats = [], [], []
    for r in range(1, cfg.repeats + 1):
        status.update(f"{name}: run {r}/{cfg.repeats}: rollwise")
        seconds, s = _run_rollwise(cfg, engine, zero_stats, prompts, lengths, fork)
        rollwise_s.append(seconds)
        stats.append(s)
        status.update(f"{name}: run {r}/{cfg.repeats}: hf generate")
        hf_s.append(_run_hf(cfg, model, pad, prompts, lengths, r))
    rollwise_tok_s = statistics.median(useful / s for s in rollwise_s)
    hf_tok_s = statistics.median(useful / s for s in hf_s)
    median_run = sorted(range(cfg.repeats), key=lambda r: rollwise_s[r])[(cfg.repeats - 1) // 2]
    return {
        "rollwise_tok_s": rollwise_tok_s,
        "hf_tok_s": hf_tok_s,
        "ratio": rollwise_tok_s / hf_tok_s,
        "flop_utilization": 2 * params_count * rollwise_tok_s / flops,
        "ratio_paired": statistics.median(h / r for r, h in zip(rollwise_s, hf_s)),
        "useful_tokens": useful,
        "hf_computed_tokens": hf_computed,
        "median_length": statistics.median(lengths),
        "max_length": max(lengths),
        "rollwise_seconds": rollwise_s,
        "hf_seconds": hf_s,
        "rollwise_stats": stats[median_run],
    }


def run_engine_bench(overrides: list[str], console) -> dict:
    """Benchmark rollwise's engine against HF ``model.generate``; print a table per model, return the results.

    Returns ``{"workloads": {NAME: {"rollwise_tok_s", "hf_tok_s", "ratio", "flop_utilization", ...}},
    "models": {MODEL: {"params", "workloads": {...}}}, ...}``: the top-level ``workloads`` are
    those of the last model in ``models`` (by default the larger preset, where arithmetic
    dominates). ``ratio`` = rollwise / hf of the two medians (above 1: rollwise is faster);
    ``ratio_paired`` is the median over repeats of adjacent pairs' ratios, steadier on a loaded machine.
    """
    cfg = load_bench_config(overrides)
    with session(cfg.threads):
        return _run_models(cfg, console)


def _run_models(cfg: EngineBenchConfig, console) -> dict:
    from rollwise.model.tiny import build_tiny

    models = {}
    # no inference_mode: both sides run under their own no_grad, as the engine runs in training;
    # the session's forked RNG keeps HF's reseeding of the global generator from leaking to the caller
    with console.status("measuring matmul FLOP/s") as status:
        flops = matmul_flops()
        for name in cfg.models:
            if name == REAL_MODEL:
                from rollwise.bench.chat import load_chat_model

                status.update(f"loading {cfg.model_path}")
                model, tok = load_chat_model(cfg.model_path, seed=cfg.seed)
            else:
                model, tok = build_tiny(name, seed=cfg.seed)
            model.eval()
            params_count = sum(p.numel() for p in model.parameters())
            workloads = {}
            # batch_sizes: one side-by-side measurement per size, keyed "workload@size"
            for size in cfg.batch_sizes or [cfg.batch_size]:
                sized = cfg.model_copy(update={"batch_size": size})
                for w in cfg.workloads:
                    key = w if cfg.batch_sizes is None else f"{w}@{size}"
                    status.update(f"{name} / {key}: warm-up")
                    workloads[key] = _bench_workload(sized, model, tok, params_count, w, flops, status)
            models[name] = {"params": params_count, "workloads": workloads}
            _print_table(console, cfg, name, params_count, workloads)
    console.print(f"matmul: {flops / 1e9:.1f} GFLOP/s (fp32, {torch.get_num_threads()} threads)", highlight=False)
    return {
        "workloads": models[cfg.models[-1]]["workloads"],
        "models": models,
        "matmul_flop_s": flops,
        "engine": cfg.engine,
        "torch_threads": torch.get_num_threads(),
        "settings": cfg.model_dump(),
    }


def _print_table(console, cfg, name: str, params_count: int, workloads: dict) -> None:
    batch = f"batch {cfg.batch_size}" if cfg.batch_sizes is None else "batch size after @"
    console.print(table(
        f"{cfg.engine} engine vs HF generate — {name} ({params_count:,} params), {cfg.num_prompts} requests, {batch}, "
        f"median of {cfg.repeats}",
        ("workload", "rollwise tok/s", "hf tok/s", "ratio", "paired", "flop util", "rows: rollwise / hf"),
        [[w, f"{r['rollwise_tok_s']:,.0f}", f"{r['hf_tok_s']:,.0f}", f"{r['ratio']:.2f}x", f"{r['ratio_paired']:.2f}x",
          f"{r['flop_utilization']:.1%}",
          f"{r['rollwise_stats']['padded_decode_slots']:,} / {r['hf_computed_tokens']:,}"]
         for w, r in workloads.items()]))
