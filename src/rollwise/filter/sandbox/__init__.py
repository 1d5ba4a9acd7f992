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

from rollwise.filter.sandbox.config import SandboxConfig
from rollwise.filter.sandbox.isolation import Isolation, SandboxUnavailable, detect
from rollwise.filter.sandbox.pool import ExecResult, Job, SandboxPool

DEFAULT_TIMEOUT_S = SandboxConfig.model_fields["timeout_s"].default
DEFAULT_MEMORY_MB = SandboxConfig.model_fields["memory_mb"].default


class Sandbox:
    """The run's sandbox: a lazy handle on one ``SandboxPool``.

    The run creates it (``Trainer``: ``Sandbox(cfg.sandbox)``) and passes it to the tasks and
    rewards that run code; ``.pool`` starts the workers on first use, so a run without code never
    starts them, and ``close()`` stops them. There is no process-wide pool to configure first.

    >>> with Sandbox(SandboxConfig(workers=1)) as sb:           # doctest: +SKIP
    ...     sb.pool.run("print(6 * 7)").stdout
    '42\\n'
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        self._pool: SandboxPool | None = None

    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            self._pool = SandboxPool(self.config)
        return self._pool

    @property
    def started(self) -> bool:
        return self._pool is not None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_python(code: str, *, stdin: str = "", timeout_s: float = DEFAULT_TIMEOUT_S,
               memory_mb: int = DEFAULT_MEMORY_MB, sandbox: Sandbox | None = None) -> ExecResult:
    """Run ``code`` as a Python program in the sandbox; never raises because of what it did.

    Uses ``sandbox``'s pool, or a one-worker pool started for this call alone. Raises
    ``SandboxUnavailable`` only if the sandbox itself cannot start here (the message names
    what is missing and the fix).
    """
    if sandbox is not None:
        return sandbox.pool.run(code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)
    with SandboxPool(SandboxConfig(workers=1)) as pool:
        return pool.run(code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)


__all__ = ["ExecResult", "Isolation", "Job", "Sandbox", "SandboxConfig", "SandboxPool", "SandboxUnavailable",
           "detect", "run_python"]
