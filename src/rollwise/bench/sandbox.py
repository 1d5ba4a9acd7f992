"""``rollwise bench sandbox``: sandboxed executions per second, pool vs one process per run.

Both sides run the same trivial program (``print(1)`` by default) with the same interpreter
(the sandbox's, ``sandbox.python``), in one process, alternating pool, naive, pool, naive...
so drift in machine load hits both (DESIGN.md, "Measuring"):

- **pool**: ``SandboxPool.map`` of ``runs`` jobs over ``workers`` pre-started sandboxed
  workers (every isolation layer on: uid, bubblewrap, seccomp, rlimits, timeout, output cap);
- **naive**: ``subprocess.run([python, "-c", program])`` per job, one after another, with no
  isolation at all — the cost of starting an interpreter per run, which is the floor for any
  sandbox that starts a process per run.

The headline is the ratio of executions per second (median of ``repeats``). Pool start-up
(detection and pre-starting the workers) happens before timing, as in training, where the
pool lives for the whole run; it is reported separately.
"""

from __future__ import annotations

import statistics
import subprocess
import time

from pydantic import Field

from rollwise.bench.harness import load_settings, table
from rollwise.config import StrictModel
from rollwise.filter.sandbox import Job, SandboxConfig, SandboxPool


class SandboxBenchConfig(StrictModel):
    """Settings of ``rollwise bench sandbox`` (override with ``--set key=value``)."""

    program: str = Field("print(1)", description="the program both sides run")
    runs: int = Field(400, ge=1, description="pool executions per timed repeat")
    naive_runs: int = Field(100, ge=1, description="subprocess.run executions per timed repeat")
    repeats: int = Field(3, ge=1, description="timed repeats per side (alternating); the median is reported")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="the pool's sandbox settings")


def _pool_rate(pool: SandboxPool, program: str, runs: int) -> float:
    start = time.perf_counter()
    results = pool.map([Job(program)] * runs)
    elapsed = time.perf_counter() - start
    bad = [r for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} of {runs} pool runs failed, e.g. {bad[0]}")
    return runs / elapsed


def _naive_rate(python: str, program: str, runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        subprocess.run([python, "-c", program], capture_output=True, check=True)
    return runs / (time.perf_counter() - start)


def run_sandbox_bench(overrides: list[str] = (), console=None) -> dict:
    cfg = load_settings(SandboxBenchConfig, list(overrides))
    t0 = time.perf_counter()
    pool = SandboxPool(cfg.sandbox)
    startup_s = time.perf_counter() - t0
    try:
        python = pool.isolation.python
        if console:
            console.print(pool.isolation.describe(), highlight=False)
        _pool_rate(pool, cfg.program, min(cfg.runs, 50))  # warm-up: first forks, page cache
        _naive_rate(python, cfg.program, min(cfg.naive_runs, 5))
        pool_rates, naive_rates = [], []
        for _ in range(cfg.repeats):
            pool_rates.append(_pool_rate(pool, cfg.program, cfg.runs))
            naive_rates.append(_naive_rate(python, cfg.program, cfg.naive_runs))
        workers = len(pool.uids)
        layers = pool.isolation.layers
    finally:
        pool.close()
    pool_s, naive_s = statistics.median(pool_rates), statistics.median(naive_rates)
    results = {"pool_exec_s": round(pool_s, 1), "naive_exec_s": round(naive_s, 1), "ratio": round(pool_s / naive_s, 2),
               "workers": workers, "isolation": layers, "python": python, "program": cfg.program,
               "pool_startup_s": round(startup_s, 3), "pool_exec_s_repeats": [round(r, 1) for r in pool_rates],
               "naive_exec_s_repeats": [round(r, 1) for r in naive_rates]}
    if console:
        console.print(table(f"sandbox executions/s ({cfg.program!r}, median of {cfg.repeats})",
                            ("side", "exec/s", "repeats"),
                            [[f"pool ({workers} workers, sandboxed)", f"{pool_s:.0f}",
                              ", ".join(f"{r:.0f}" for r in pool_rates)],
                             ["subprocess.run per job (no sandbox)", f"{naive_s:.0f}",
                              ", ".join(f"{r:.0f}" for r in naive_rates)]], left=("repeats",)))
        console.print(f"ratio: {results['ratio']}× (pool start-up {startup_s:.2f}s, not timed)")
    return results
