"""The one place that reads the CPU, and the one micro-benchmark a precision choice rests on.

``cpu_info(path)`` parses ``/proc/cpuinfo`` (any file of that format: tests hand in fixed
samples from ``tests/fixtures/cpuinfo/``; ``ROLLWISE_CPUINFO`` points the default elsewhere)
into a ``CpuInfo``: the model name, the instruction-set flags a precision choice depends on
(``FLAGS``) and the logical core count. Where there is no such file (macOS, Windows) it gives
the platform's processor name, no flags and ``os.cpu_count()`` — so nothing is ever chosen
for a feature the CPU was not seen to have.

``native_bf16(info)``: the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX BF16). On an
AVX2-only CPU torch runs bf16 matmuls by conversion, several times slower than fp32.

``bf16_speedup(shapes)``: fp32 time / bf16 time of ``F.linear`` at a model's own shapes (its
MLP up-projection [M, hidden] × [hidden, intermediate] and its LM head [M, hidden] × [hidden,
vocab], M = 32 rows), measured once per machine and cached in
``~/.cache/rollwise/kernels.json`` (``ROLLWISE_CACHE_DIR`` or the ``cache_dir`` argument moves
it) under a key of the CPU model, the torch version and the shapes. A speed ratio is measured,
never assumed: it is what the caller compares to 1.

``cpu_record()``: what every run summary and benchmark JSON records about the machine.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni")  # the flags a precision choice reads
CPUINFO_ENV = "ROLLWISE_CPUINFO"  # another cpuinfo file in place of /proc/cpuinfo (tests pin the detection)
CACHE_ENV = "ROLLWISE_CACHE_DIR"  # where the benchmark cache lives (default ~/.cache/rollwise)


@dataclass(frozen=True)
class CpuInfo:
    """What a precision choice needs to know about the CPU."""

    model: str  # "model name" (x86) or the best name the file gives
    flags: frozenset[str]  # the members of FLAGS the CPU reports
    cores: int  # logical processors

    def has(self, flag: str) -> bool:
        return flag in self.flags


def default_cpuinfo_path() -> str:
    return os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo"


def cpu_info(path: str | os.PathLike | None = None) -> CpuInfo:
    """The CPU as ``path`` (default ``/proc/cpuinfo``, or ``$ROLLWISE_CPUINFO``) describes it.

    >>> cpu_info("/nonexistent").flags
    frozenset()
    """
    try:
        text = Path(path or default_cpuinfo_path()).read_text(errors="replace")
    except OSError:  # no /proc (macOS, Windows): claim no feature we did not see
        return CpuInfo(platform.processor() or platform.machine() or "unknown", frozenset(), os.cpu_count() or 1)
    fields: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor" and value.isdigit():
            processors += 1
        fields.setdefault(key, value)  # the first processor's entry speaks for all
    # x86: "flags"; ARM: "features" (it names no x86 flag, so none is found)
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    model = fields.get("model name") or fields.get("hardware") or fields.get("cpu model") or platform.machine()
    return CpuInfo(model or "unknown", frozenset(f for f in FLAGS if f in flags), processors or os.cpu_count() or 1)


def native_bf16(info: CpuInfo) -> bool:
    """The CPU has bf16 arithmetic in hardware (AVX-512 BF16 or AMX BF16)."""
    return info.has("avx512_bf16") or info.has("amx_bf16")


def cpu_record(info: CpuInfo | None = None) -> dict:
    """The machine as a run summary or benchmark JSON records it."""
    import torch

    info = info or cpu_info()
    return {"model": info.model, "cores": info.cores, "flags": sorted(info.flags),
            "native_bf16": native_bf16(info), "torch": torch.__version__}


@dataclass(frozen=True)
class Shapes:
    """A model's matmul shapes that decide its sampling speed."""

    hidden: int
    intermediate: int
    vocab: int
    rows: int = 32  # M: tokens per decode step (a batch of running sequences)

    @classmethod
    def of(cls, model) -> "Shapes":
        c = model.config
        hidden = c.hidden_size
        return cls(hidden, getattr(c, "intermediate_size", None) or 4 * hidden, c.vocab_size)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rollwise")


def bf16_speedup(shapes: Shapes, info: CpuInfo | None = None, directory: str | os.PathLike | None = None,
                 measure=None) -> float:
    """fp32 time / bf16 time of ``F.linear`` at ``shapes`` on this CPU (> 1: bf16 is faster), from
    the cache when this CPU model, torch version and shapes were measured before. ``measure``
    replaces the timing (tests)."""
    import torch

    info = info or cpu_info()
    path = Path(directory or cache_dir()) / "kernels.json"
    key = f"{info.model}|torch {torch.__version__}|{shapes.hidden}x{shapes.intermediate}x{shapes.vocab}@{shapes.rows}"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if key in cached:
        return float(cached[key])
    ratio = float((measure or _measure)(shapes))
    cached[key] = ratio
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=1, sort_keys=True))
    except OSError:  # a read-only home: measured again next time, nothing else lost
        pass
    return ratio


def _measure(shapes: Shapes, repeats: int = 5) -> float:
    """Best-of-``repeats`` time of the MLP up-projection and the LM head, fp32 over bf16."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shapes.rows, shapes.hidden, generator=gen)
    w_up = torch.randn(shapes.intermediate, shapes.hidden, generator=gen)
    w_head = torch.randn(shapes.vocab, shapes.hidden, generator=gen)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        xs, ws = x.to(dtype), (w_up.to(dtype), w_head.to(dtype))
        times = []
        for _ in range(repeats + 1):  # the first run warms up (kernel selection, page faults)
            start = time.perf_counter()
            for w in ws:
                F.linear(xs, w)
            times.append(time.perf_counter() - start)
        best[dtype] = min(times[1:])
    return best[torch.float32] / max(best[torch.bfloat16], 1e-12)
