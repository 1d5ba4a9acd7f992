"""Run model-written Python safely: ``run_python(code, stdin=..., timeout_s=..., memory_mb=...)``.

Code rewards run text written by a model that is being trained to maximise reward, so the
sandbox assumes hostile code. It stacks the layers measured to work on our machines — a
separate unprivileged uid per worker, bubblewrap with every namespace unshared, a seccomp
filter, rlimits, a wall-clock timeout that kills the whole process tree, an output cap, and
a subreaper that reaps every leftover — behind a pool of pre-started workers that fork one
child per run (``pool.py``), so grading costs a ``fork``, not an interpreter start-up.
``docs/sandbox.md`` describes each layer, what is detected, and the measured throughput.

Sources: the isolation model follows what code-execution services do (SandboxFusion, E2B,
Judge0: per-run limits, no network, a throwaway filesystem); the pre-forked worker follows
the zygote pattern (Android's zygote, Python's ``multiprocessing`` forkserver).

Departures: no cgroup (memory and processes are bounded per process by rlimits, so a run's
total memory is at most ``max_processes`` × ``memory_mb``); one interpreter per worker, so
the code runs under the sandbox's Python (``sandbox.python``), not the trainer's venv.

>>> from rollwise.filter.sandbox import run_python
>>> run_python("print(sum(map(int, input().split())))", stdin="2 3").stdout   # doctest: +SKIP
'5\\n'
"""

from __future__ import annotations

import atexit
import threading

from rollwise.filter.sandbox.config import SandboxConfig
from rollwise.filter.sandbox.isolation import Isolation, SandboxUnavailable, detect
from rollwise.filter.sandbox.pool import ExecResult, Job, SandboxPool

DEFAULT_TIMEOUT_S = SandboxConfig.model_fields["timeout_s"].default
DEFAULT_MEMORY_MB = SandboxConfig.model_fields["memory_mb"].default

_lock = threading.Lock()
_pool: SandboxPool | None = None
_config: SandboxConfig | None = None


def configure(config: SandboxConfig | None) -> None:
    """Set the config of the shared pool; a running pool with another config is replaced."""
    global _pool, _config
    with _lock:
        if _pool is not None and _pool.config != (config or SandboxConfig()):
            _pool.close()
            _pool = None
        _config = config


def default_pool() -> SandboxPool:
    """The process-wide pool (started on first use with the configured ``SandboxConfig``)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = SandboxPool(_config)
        return _pool


def shutdown() -> None:
    """Stop the shared pool's workers (it restarts on next use)."""
    global _pool
    with _lock:
        if _pool is not None:
            _pool.close()
            _pool = None


atexit.register(shutdown)


def run_python(code: str, *, stdin: str = "", timeout_s: float = DEFAULT_TIMEOUT_S,
               memory_mb: int = DEFAULT_MEMORY_MB) -> ExecResult:
    """Run ``code`` as a Python program in the sandbox; never raises because of what it did.

    Raises ``SandboxUnavailable`` only if the sandbox itself cannot start here (the message
    names what is missing and the fix).
    """
    return default_pool().run(code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)


__all__ = ["ExecResult", "Isolation", "Job", "SandboxConfig", "SandboxPool", "SandboxUnavailable", "configure",
           "default_pool", "detect", "run_python", "shutdown"]
