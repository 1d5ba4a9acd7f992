"""``SandboxPool``: pre-started sandboxed workers that run Python code, many runs in parallel.

Each worker is one sandboxed, warm interpreter (``zygote.py``) that forks a child per run, so
a run costs a ``fork`` instead of an interpreter start-up. One thread per worker takes runs
from a shared queue; ``map`` scores a batch of completions in parallel (the trainer calls it
from the scoring stage). The pool never raises because of what the code did: every failure
— including a worker that dies or stops answering — comes back as an ``ExecResult`` with a
reason, and the worker is replaced. Workers are also replaced every ``recycle_every`` runs.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from rollwise.filter.sandbox.config import SandboxConfig
from rollwise.filter.sandbox.isolation import (
    Isolation,
    SandboxUnavailable,
    bwrap_args,
    claim_uid,
    detect,
    drop_kwargs,
)
from rollwise.filter.sandbox.seccomp import build_bpf

log = logging.getLogger(__name__)

ZYGOTE_SOURCE = (Path(__file__).parent / "zygote.py").read_text()
START_TIMEOUT_S = 30.0
REPLY_GRACE_S = 5.0  # the worker enforces the timeout; the pool kills it if it is this late


@dataclass(frozen=True)
class ExecResult:
    """What one run did. ``returncode`` < 0 means killed by that signal (as in ``subprocess``)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    reason: str = ""  # why it was stopped (timeout, output cap, signal, lost worker), or empty
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.reason


@dataclass(frozen=True)
class Job:
    code: str
    stdin: str = ""
    timeout_s: float | None = None
    memory_mb: int | None = None


class _WorkerLost(Exception):
    pass


class _Worker:
    """One sandboxed zygote process and the pipes to it."""

    def __init__(self, pool: SandboxPool, uid: int | None):
        self.pool, self.uid = pool, uid
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.pids: list[int] = []  # every process this slot has started, in order
        self.hostdir: tempfile.TemporaryDirectory | None = None

    def start(self) -> None:
        iso, cfg = self.pool.isolation, self.pool.config
        command = [iso.python, "-I", "-S", "-c", ZYGOTE_SOURCE]
        if iso.bwrap:
            argv, cwd, workdir, writable = [*bwrap_args(iso.bwrap, iso.python, cfg.tmpfs_mb), *command], None, "/tmp", ["/tmp", "/dev/shm"]
        else:  # no namespaces: a private directory on the host, owned by the worker's uid
            self.hostdir = tempfile.TemporaryDirectory(prefix="rollwise-sandbox-")
            if self.uid is not None:
                os.chown(self.hostdir.name, self.uid, self.uid)
            argv, cwd, workdir, writable = command, self.hostdir.name, self.hostdir.name, [self.hostdir.name]
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, cwd=cwd,
                                     env={}, start_new_session=True, **drop_kwargs(self.uid))
        self.pids.append(self.proc.pid)
        init = {"workdir": workdir, "writable": writable, "seccomp_hex": self.pool.bpf_hex,
                # kill(-1) reaches only the job's processes when the worker has its own PID namespace or uid
                "kill_all_uid": bool(iso.bwrap) or self.uid is not None, "parent_death": not iso.bwrap}
        try:
            self._send(init)
            ready = self._recv(START_TIMEOUT_S)
        except _WorkerLost:
            self.stderr.seek(0)
            err = self.stderr.read().decode(errors="replace").strip()[-500:]
            self.stop()
            raise SandboxUnavailable(f"sandbox worker failed to start: {err or 'no output'}") from None
        self.info = ready
        self.runs = 0

    def _send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(body)) + body)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise _WorkerLost("worker closed its input") from None

    def _read(self, n: int, deadline: float) -> bytes:
        fd, out = self.proc.stdout.fileno(), bytearray()
        while len(out) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise _WorkerLost("no reply in time")
            data = os.read(fd, n - len(out))
            if not data:
                raise _WorkerLost("worker exited")
            out += data
        return bytes(out)

    def _recv(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        (size,) = struct.unpack(">I", self._read(4, deadline))
        if size > 4 * self.pool.config.max_output_bytes + 65536:
            raise _WorkerLost(f"reply of {size} bytes")
        return json.loads(self._read(size, deadline))

    def run(self, job: dict) -> ExecResult:
        self._send(job)
        reply = self._recv(job["timeout_s"] + REPLY_GRACE_S)
        self.runs += 1
        return ExecResult(**reply)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 9)  # bwrap or the zygote; --die-with-parent takes the rest
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for f in (self.proc.stdin, self.proc.stdout, self.stderr):
                f.close()
            self.proc = None
            if not self.pool.isolation.bwrap and self.uid is not None:
                # no PID namespace took the job's processes down with the worker: kill(-1) as the uid
                subprocess.run([self.pool.isolation.python, "-I", "-S", "-c", "import os; os.kill(-1, 9)"],
                               env={}, cwd="/", check=False, **drop_kwargs(self.uid))
        if self.hostdir is not None:
            self.hostdir.cleanup()
            self.hostdir = None


class SandboxPool:
    """Sandboxed Python runs, ``config.workers`` at a time.

    >>> with SandboxPool() as pool:                                  # doctest: +SKIP
    ...     pool.run("print(input()[::-1])", stdin="abc").stdout
    'cba\\n'
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = cfg = config or SandboxConfig()
        self.isolation: Isolation = detect(cfg.python, cfg.uid_base, cfg.tmpfs_mb)
        if self.isolation.python is None:
            raise SandboxUnavailable(f"sandbox.python: {self.isolation.python_note}")
        if self.isolation.missing:
            if cfg.isolation == "full":
                raise SandboxUnavailable(
                    "full sandbox isolation is not available here: " + "; ".join(self.isolation.missing)
                    + ". Install what is missing (make install sets up bubblewrap and pyseccomp), or accept weaker "
                    "isolation explicitly with sandbox.isolation=best_effort (task.sandbox.isolation in a training "
                    "recipe)")
            log.warning("sandbox running with LESS THAN FULL isolation (sandbox.isolation=best_effort); missing: %s",
                        "; ".join(self.isolation.missing))
        log.info("%s", self.isolation.describe())
        self.bpf_hex = build_bpf().hex() if self.isolation.seccomp else ""
        n = cfg.workers or os.cpu_count() or 1
        worst_mb = n * cfg.max_processes * cfg.memory_mb  # rlimits bound each process, not their sum
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
        if worst_mb > total_mb:
            log.warning("sandbox: %d workers x %d processes x %d MiB can reach %d MiB, more than this machine's "
                        "%d MiB; lower sandbox.workers, max_processes or memory_mb", n, cfg.max_processes,
                        cfg.memory_mb, worst_mb, total_mb)
        self._locks, uids = [], []
        for _ in range(n if self.isolation.root else 0):
            uid, lock = claim_uid(cfg.uid_base, taken=set(uids))
            uids.append(uid)
            self._locks.append(lock)
        self._workers = [_Worker(self, uids[i] if uids else None) for i in range(n)]
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        # each worker is started by the thread that serves it: --die-with-parent and PDEATHSIG
        # fire when the *thread* that forked a process exits, so it must live as long as the worker
        started = [Future() for _ in self._workers]
        self._threads = [threading.Thread(target=self._serve, args=(w, f), daemon=True, name=f"sandbox-{i}")
                         for i, (w, f) in enumerate(zip(self._workers, started))]
        for t in self._threads:
            t.start()
        errors = [f.exception() for f in started]
        if any(errors):
            self.close()
            raise next(e for e in errors if e)

    @property
    def uids(self) -> list[int | None]:
        return [w.uid for w in self._workers]

    def _job(self, job: Job) -> dict:
        cfg = self.config
        return {"code": job.code, "stdin": job.stdin, "timeout_s": float(job.timeout_s or cfg.timeout_s),
                "memory_mb": int(job.memory_mb or cfg.memory_mb), "file_mb": cfg.max_file_mb,
                "open_files": cfg.max_open_files, "processes": cfg.max_processes,
                "output_bytes": cfg.max_output_bytes}

    def _serve(self, worker: _Worker, started: Future) -> None:
        try:
            worker.start()
        except SandboxUnavailable as err:
            started.set_exception(err)
            return
        started.set_result(None)
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            future.set_result(self._run_on(worker, self._job(job)))
            if worker.proc is not None and worker.runs >= self.config.recycle_every:
                worker.stop()
            if worker.proc is None and not self._closed:
                self._restart(worker)

    def _restart(self, worker: _Worker) -> None:
        try:
            worker.start()
        except SandboxUnavailable as err:  # next run will try again and report it
            log.error("sandbox worker could not be restarted: %s", err)

    def _run_on(self, worker: _Worker, job: dict) -> ExecResult:
        if worker.proc is None:
            self._restart(worker)
            if worker.proc is None:
                return ExecResult(-1, "", "", reason="sandbox worker could not be started (see the log)")
        try:
            return worker.run(job)
        except _WorkerLost as err:
            worker.stop()
            late = "no reply in time" in str(err)
            return ExecResult(-9, "", "", timed_out=late,
                              reason=f"sandbox worker lost ({err}); the run was stopped and the worker replaced")
        except Exception as err:  # a pool bug must not take training down either
            log.exception("sandbox run failed")
            worker.stop()
            return ExecResult(-1, "", "", reason=f"sandbox error ({type(err).__name__}: {err})")

    def submit(self, code: str, *, stdin: str = "", timeout_s: float | None = None,
               memory_mb: int | None = None) -> Future:
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        future: Future = Future()
        self._queue.put((Job(code, stdin, timeout_s, memory_mb), future))
        return future

    def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None,
            memory_mb: int | None = None) -> ExecResult:
        return self.submit(code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb).result()

    def map(self, jobs: list[Job]) -> list[ExecResult]:
        """Run every job, ``workers`` at a time; results in the order of ``jobs``."""
        futures = [self.submit(j.code, stdin=j.stdin, timeout_s=j.timeout_s, memory_mb=j.memory_mb) for j in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join()
        for w in self._workers:
            w.stop()
        for lock in self._locks:
            lock.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
