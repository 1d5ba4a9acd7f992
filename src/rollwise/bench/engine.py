"""``rollwise bench engine``: the embedded engine against Hugging Face ``model.generate``.

Both sides run the same model object, the same tokenized prompts, the same sampling
settings (plain sampling: temperature, no top-k, no top-p) and the same batches, in the
same process, alternating A, B, A, B... so that drift in machine load hits both. The
headline is the ratio of their *useful* generated tokens per second; absolute numbers on
a shared machine are noise (DESIGN.md, "Measuring").

How the workload is built, and why:

- The model is a tiny preset with its random init. An untrained model's lengths are
  arbitrary, so EOS is switched off on both sides (the engine gets no stop ids, HF gets
  ``eos_token_id=None``) and each request instead gets its own ``max_new_tokens`` drawn
  uniformly from ``[min_new_tokens, max_new_tokens]`` with a seeded RNG: varying lengths
  as in a real rollout, with no training needed.
- HF ``generate`` has one ``max_new_tokens`` per call. So the requests are cut into the
  same consecutive batches of ``batch_size`` the engine forms, each HF batch runs to the
  largest ``max_new_tokens`` in it, and only the tokens each request would have kept (its
  own ``max_new_tokens``) count as useful. That is exactly what the v1 engine does too (a
  static batch decodes until its longest row is done) so today the two should compute the
  same number of decode rows; an engine that stops paying for finished rows (continuous
  batching) will show up as a ratio above what raw kernel speed explains.
- Timed regions cover everything from token-id lists to generated ids on both sides:
  left-padding the batch, prefill, decode and sampling. Each side gets one untimed warm-up
  pass first. ``torch`` threads are left at their default.
"""

from __future__ import annotations

import random
import statistics
import time
import warnings
from contextlib import contextmanager
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.config import ConfigError, StrictModel, apply_overrides, validate


class EngineBenchConfig(StrictModel):
    """Settings of ``rollwise bench engine`` (override with ``--set key=value``)."""

    preset: Literal["tiny", "small"] = Field("tiny", description="tiny model preset to benchmark (random init)")
    seed: int = Field(0, ge=0, description="seeds the model init, the prompts, the length draws and sampling")
    num_prompts: int = Field(64, ge=1, description="number of arith train prompts (one request each)")
    batch_size: int = Field(64, ge=1, description="requests per batch, the same for both sides")
    min_new_tokens: int = Field(16, ge=1, description="smallest per-request max_new_tokens drawn")
    max_new_tokens: int = Field(96, ge=1, description="largest per-request max_new_tokens drawn (inclusive)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature, the same for both sides")
    repeats: int = Field(3, ge=1, description="timed runs per side (alternating); the median is reported")


def load_bench_config(overrides: list[str]) -> EngineBenchConfig:
    cfg = validate(EngineBenchConfig, apply_overrides({}, list(overrides)))
    if cfg.min_new_tokens > cfg.max_new_tokens:
        raise ConfigError(
            f"config field 'min_new_tokens' ({cfg.min_new_tokens}) must be <= 'max_new_tokens' ({cfg.max_new_tokens})"
        )
    return cfg


@contextmanager
def _quiet_transformers():
    """Silence transformers' logging and Python warnings for the duration (restored after)."""
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(old)


def _left_pad(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, batch))
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def _batches(n: int, size: int) -> list[range]:
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def run_engine_bench(overrides: list[str], console) -> dict:
    """Benchmark rollwise's ``Engine`` against HF ``model.generate``; print a table, return the results.

    The headline for both sides is **useful tokens/s**: the sum over requests of the tokens
    each request asked for (its own ``max_new_tokens``; EOS is disabled so every request
    runs to it), divided by wall time. HF cannot stop rows individually, so each of its
    batches (the same requests, in the same batches, as the engine's) runs to the batch's
    largest ``max_new_tokens`` and its extra tokens are computed but not counted.
    ``ratio`` = rollwise / hf of the two medians: above 1 means the engine is faster.
    ``ratio_paired`` is the median over repeats of each adjacent (rollwise, hf) pair's speed
    ratio: on a loaded machine a stall hits one pair, so this is the steadier of the two.
    """
    from rollwise.engine.engine import Engine, Request
    from rollwise.engine.sampling import SamplingParams
    from rollwise.model.tiny import PRESETS, build_tiny
    from rollwise.tasks.arith import build as build_arith

    cfg = load_bench_config(overrides)
    model, tok = build_tiny(cfg.preset, seed=cfg.seed)
    model.eval()
    params_count = sum(p.numel() for p in model.parameters())

    task = build_arith(cfg.seed)
    prompts = [tok(task.train.get(i).text)["input_ids"] for i in range(cfg.num_prompts)]
    rng = random.Random(f"bench-engine:{cfg.seed}")
    lengths = [rng.randint(cfg.min_new_tokens, cfg.max_new_tokens) for _ in prompts]
    longest = max(map(len, prompts)) + cfg.max_new_tokens
    if longest > PRESETS[cfg.preset].max_positions:
        raise ConfigError(
            f"prompt plus max_new_tokens reaches {longest} positions, over the '{cfg.preset}' preset's "
            f"{PRESETS[cfg.preset].max_positions}; lower max_new_tokens"
        )
    useful_tokens = sum(lengths)
    batches = _batches(len(prompts), cfg.batch_size)
    hf_computed = sum(len(b) * max(lengths[i] for i in b) for b in batches)

    def run_rollwise(run: int) -> tuple[float, dict]:
        engine = Engine(model, pad_token_id=tok.pad_token_id, max_batch_size=cfg.batch_size, seed=cfg.seed * 1000 + run)
        requests = [
            Request(p, SamplingParams(temperature=cfg.temperature, max_new_tokens=n, stop_token_ids=()))
            for p, n in zip(prompts, lengths)
        ]
        start = time.perf_counter()
        outs = engine.generate(requests)
        seconds = time.perf_counter() - start
        got = sum(len(o.token_ids) for o in outs)
        if got != useful_tokens:
            raise RuntimeError(f"engine produced {got} tokens, expected {useful_tokens} (EOS should be off)")
        return seconds, engine.stats.as_dict()

    def run_hf(run: int) -> float:
        torch.manual_seed(cfg.seed * 1000 + run)  # HF samples from the global generator
        got = 0
        start = time.perf_counter()
        for b in batches:
            ids, mask = _left_pad([prompts[i] for i in b], tok.pad_token_id)
            new = max(lengths[i] for i in b)
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=cfg.temperature, top_k=0,
                top_p=1.0, max_new_tokens=new, pad_token_id=tok.pad_token_id, eos_token_id=None,
            )
            generated = out.shape[1] - ids.shape[1]
            got += sum(min(lengths[i], generated) for i in b)
        seconds = time.perf_counter() - start
        if got != useful_tokens:
            raise RuntimeError(f"HF generate produced {got} useful tokens, expected {useful_tokens} (did EOS stop it?)")
        return seconds

    rollwise_s: list[float] = []
    hf_s: list[float] = []
    stats: list[dict] = []
    # no inference_mode: both sides run under their own no_grad, as the engine runs in training;
    # fork_rng keeps HF's reseeding of the global generator from leaking to the caller
    with _quiet_transformers(), torch.random.fork_rng(), console.status("warm-up") as status:
        run_rollwise(0)
        run_hf(0)
        for r in range(1, cfg.repeats + 1):
            status.update(f"run {r}/{cfg.repeats}: rollwise")
            seconds, s = run_rollwise(r)
            rollwise_s.append(seconds)
            stats.append(s)
            status.update(f"run {r}/{cfg.repeats}: hf generate")
            hf_s.append(run_hf(r))

    rollwise_tok_s = statistics.median(useful_tokens / s for s in rollwise_s)
    hf_tok_s = statistics.median(useful_tokens / s for s in hf_s)
    median_run = sorted(range(cfg.repeats), key=lambda r: rollwise_s[r])[(cfg.repeats - 1) // 2]
    results = {
        "model": cfg.preset,
        "params": params_count,
        "num_prompts": cfg.num_prompts,
        "batch_size": cfg.batch_size,
        "useful_tokens": useful_tokens,
        "hf_computed_tokens": hf_computed,
        "rollwise_tok_s": rollwise_tok_s,
        "hf_tok_s": hf_tok_s,
        "ratio": rollwise_tok_s / hf_tok_s,
        "ratio_paired": statistics.median(h / r for r, h in zip(rollwise_s, hf_s)),
        "rollwise_seconds": rollwise_s,
        "hf_seconds": hf_s,
        "rollwise_stats": stats[median_run],
        "torch_threads": torch.get_num_threads(),
        "settings": cfg.model_dump(),
    }

    table = Table(title=f"engine vs HF generate — {cfg.preset} ({params_count:,} params), "
                        f"{cfg.num_prompts} prompts, batch {cfg.batch_size}, median of {cfg.repeats}")
    table.add_column("engine")
    table.add_column("useful tok/s", justify="right")
    table.add_column("median s", justify="right")
    table.add_column("decode rows computed", justify="right")
    table.add_row("rollwise", f"{rollwise_tok_s:,.0f}", f"{statistics.median(rollwise_s):.3f}",
                  f"{stats[median_run]['padded_decode_slots']:,}")
    table.add_row("hf generate", f"{hf_tok_s:,.0f}", f"{statistics.median(hf_s):.3f}", f"{hf_computed:,}")
    console.print(table)
    console.print(f"ratio rollwise / hf: [bold]{results['ratio']:.2f}x[/] (median of paired runs "
                  f"{results['ratio_paired']:.2f}x; {useful_tokens:,} useful tokens per run)", highlight=False)
    return results
