"""The engine side of the endpoint: one thread owns the engine and steps it; HTTP handlers hand it jobs.

The slot engine is not thread-safe and batches continuously, so every request of every client
goes through one ``EngineDriver``: a handler puts a ``Job`` (one engine request per choice, or a
state to continue) in the driver's inbox from any thread; the thread running ``run`` admits
queued jobs between two engine steps, so concurrent requests share each step's batch. After
every step the driver tells each job what happened through its ``notify`` callback (from the
driver's thread: the handler bridges it into its event loop) — new tokens of a streaming
choice (``("delta", i, ids, logprobs)``) and finished choices (``("done", i, completion)``).

Stop strings: after every step a choice with ``stops`` is decoded and, once its text holds one,
paused and finished there (``finish_reason`` ``stop``; the sampled ids are kept whole, the text
is cut by the caller). A cancelled job (a client that went away, a harness past its timeout, a
closed episode) is aborted in the engine at the next step and told why (``("error", why, 409)``).

Failures stay with the jobs they touch: a request the engine refuses fails that job (``400``);
an engine step that raises fails every job in the engine (``("error", message, 500)``, their
sequences aborted) and the driver goes on serving the next ones. A ``notify`` that raises (its
event loop closed) drops that job, never the driver.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from rollwise.engine.engine import Completion, Request
from rollwise.engine.state import PartialState


@dataclass(eq=False)
class Job:
    """One chat request's engine work: a ``Request`` per choice, or ``PartialState``s to resume."""

    work: list[Request] | list[PartialState]
    notify: Callable[[tuple], None]  # called from the driver's thread
    stream: bool = False
    stops: tuple[str, ...] = ()
    skip: list[int] = field(default_factory=list)  # per choice: ids before this call's own (a continuation's)
    cancelled: bool = False
    why: str = ""  # why it was cancelled (told to a client still waiting)
    handles: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # per choice: ids already streamed (past ``skip``)
    done: list[bool] = field(default_factory=list)

    def cancel(self, why: str = "the request was cancelled") -> None:
        self.why = self.why or why
        self.cancelled = True  # read by the driver at its next step


class EngineDriver:
    """Runs ``engine`` for every job submitted from any thread (``submit``) while ``run`` runs."""

    def __init__(self, engine, decode: Callable[[list[int]], str]):
        self.engine = engine
        self.decode = decode
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._owner: dict[int, tuple[Job, int]] = {}  # engine handle -> (job, choice)
        self._jobs: list[Job] = []
        self.lock = threading.Lock()  # held while the engine steps (load weights under it from other threads)
        self.served = 0  # choices finished
        self.failed_steps = 0  # engine steps that raised (their jobs failed; serving went on)

    def submit(self, job: Job) -> None:
        self._inbox.put(job)

    def run(self, stop: Callable[[], bool]) -> None:
        """Serve until ``stop()`` holds (checked between steps, and every 20 ms while idle)."""
        while not stop():
            self._admit(block=not self._jobs)
            if self._jobs:
                with self.lock:
                    try:
                        self._step()
                    except Exception as err:  # noqa: BLE001 — a step's failure fails its jobs, not the server
                        self._fail_all(f"the engine failed: {type(err).__name__}: {err}")

    def _admit(self, block: bool) -> None:
        try:
            jobs = [self._inbox.get(timeout=0.02)] if block else []
        except queue.Empty:
            return
        while True:
            try:
                jobs.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for job in jobs:
            if job.cancelled:
                continue
            try:
                with self.lock:  # a job's choices are all fresh requests or all continuations
                    fresh = isinstance(job.work[0], Request)
                    job.handles = self.engine.submit(job.work) if fresh else self.engine.resume(job.work)
            except Exception as err:  # noqa: BLE001 — a request the engine refuses: that job fails, not the driver
                _tell(job, ("error", f"the engine refused the request: {err}", 400))
                continue
            job.sent = [0] * len(job.work)
            job.skip = job.skip or [0] * len(job.work)
            job.done = [False] * len(job.work)
            for i, h in enumerate(job.handles):
                self._owner[h] = (job, i)
            self._jobs.append(job)

    def _step(self) -> None:
        for job in [j for j in self._jobs if j.cancelled]:
            live = [h for h, d in zip(job.handles, job.done) if not d]
            self._forget(job)
            self.engine.abort(live)
            _tell(job, ("error", job.why, 409))
        if not self._jobs:
            return
        for c in self.engine.step():
            if c.handle in self._owner:
                self._finish(c)
        for job in list(self._jobs):
            for i, h in enumerate(job.handles):
                if not job.done[i] and (job.stream or job.stops):
                    self._watch(job, i, h)

    def _watch(self, job: Job, i: int, handle: int) -> None:
        """Stream new tokens of a live choice; finish it at a stop string."""
        view = self.engine.peek(handle)
        start = job.skip[i]
        ids = view.token_ids[start:]
        if job.stream and len(ids) > job.sent[i]:
            _tell(job, ("delta", i, ids[job.sent[i]:], view.logprobs[start + job.sent[i]:]))
            job.sent[i] = len(ids)
        if job.stops and any(s in self.decode(ids) for s in job.stops):
            state = self.engine.pause([handle])[0]
            self._finish(Completion(handle, state.prompt_ids, state.token_ids, state.logprobs, state.versions,
                                    "stop", forced=list(state.forced)))

    def _finish(self, c: Completion) -> None:
        job, i = self._owner.pop(c.handle)
        if job.stream and len(c.token_ids) - job.skip[i] > job.sent[i]:
            _tell(job, ("delta", i, c.token_ids[job.skip[i] + job.sent[i]:], c.logprobs[job.skip[i] + job.sent[i]:]))
        job.done[i] = True
        self.served += 1
        _tell(job, ("done", i, c))
        if all(job.done):
            self._jobs.remove(job)

    def _fail_all(self, why: str) -> None:
        """Fail every job in the engine (a step raised: their sequences' state is unknown)."""
        self.failed_steps += 1
        jobs, self._jobs = list(self._jobs), []
        for job in jobs:
            self._forget(job)
            try:
                self.engine.abort([h for h, d in zip(job.handles, job.done) if not d])
            except Exception:  # noqa: BLE001 — an engine that cannot abort either: its slots are lost, not the server
                pass
            _tell(job, ("error", why, 500))

    def _forget(self, job: Job) -> None:
        for h in job.handles:
            self._owner.pop(h, None)
        if job in self._jobs:
            self._jobs.remove(job)



def _tell(job: Job, event: tuple) -> None:
    try:
        job.notify(event)
    except Exception:  # noqa: BLE001 — its handler's loop is gone: nobody is waiting
        job.cancel("nobody is waiting")
