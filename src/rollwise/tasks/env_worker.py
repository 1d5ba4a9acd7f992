"""A worker process that holds an environment class's instances: tool calls with a hard stop (issue 32).

A thread cannot stop a tool that never releases the GIL (a big-int power, a pure-Python loop),
so an in-process environment's methods — ``reset``, its tools, ``get_reward``,
``observation_key`` — run in one persistent worker process per environment factory (per sampler),
reached through a pipe (a round trip costs tens of microseconds, not a process start).

Guarantees:

- Every request is answered within ``timeout`` seconds, whatever the environment's code does:
  past it the worker is killed (SIGKILL) and a new one started; the caller is told ``timeout``.
  A worker that dies (``os._exit``, a segfault) is restarted the same way (``died``).
- Each episode's instance lives in the worker, created and addressed by episode id
  (``open(eid, row)`` = ``cls()`` + ``reset(**row)``), dropped by ``close(eid)``.
- A killed worker takes every instance it held with it. Each live episode is rebuilt in the new
  worker by replay: ``reset(**row)`` and the tool calls it has made, in order, results ignored
  (the call that timed out is not replayed: it never happened, as far as the environment is
  concerned). An episode whose replay fails (raises in ``reset``, times out) is lost, and says
  why (``lost(eid)``): the episode scores 0 with that reason. Replay rebuilds the same state
  for an environment whose methods are deterministic given the row and the calls (the built-ins
  are); document anything else in the environment.

The worker does not hold a copy of the trainer. An environment class importable by name (a
module's top-level class: the built-ins, ``package.module:Class``) gets a worker started by
``multiprocessing``'s fork server — a small process started fresh, not a copy of the trainer — so
the worker's memory is its environments'. A forked child of the trainer would keep, page by page,
the old copy of everything the trainer writes after the fork (weights, optimizer state, caches):
measured on SmolLM2-135M-Instruct, 3.9 GB of private memory in the worker of a calculator.
A class that is not importable by name (defined in a function, a test body or a notebook's
``__main__``) is forked from the trainer instead ("fork", its code must not use the trainer's
torch threads or CUDA), and so is one whose fork-server worker could not load it.
"""

from __future__ import annotations

import multiprocessing
import pickle
import threading
import weakref
from dataclasses import dataclass, field

STARTUP_TIMEOUT = 120.0  # seconds a new worker has to say it is ready (not counted against tool_timeout)



def clip_text(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` cut to ``max_chars`` characters, saying how much was cut; and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"... [{len(text) - max_chars} more characters cut]", True


@dataclass
class _History:
    row: dict
    calls: list[tuple[str, tuple, dict]] = field(default_factory=list)


def _serve(conn, parent_end, cls, max_chars: int) -> None:  # pragma: no cover - runs in the worker process
    """The worker: say ready, then answer ``(op, eid, args)`` requests until the pipe closes (a forked
    worker closes its copy of the trainer's end, so the trainer's death — even a SIGKILL — reaches
    ``recv`` as EOF and the worker exits; a fork-server worker never had it)."""
    if parent_end is not None:
        parent_end.close()
    conn.send(("ready", None))
    envs: dict = {}
    while True:
        try:
            op, eid, args = conn.recv()
        except (EOFError, OSError):
            return
        if op == "drop":
            envs.pop(eid, None)
            continue
        if op == "open":
            _reply(conn, _open(envs, cls, eid, args[0]))
            continue
        try:
            reply = ("ok", _run(envs, cls, op, eid, args, max_chars))
        except BaseException as err:  # noqa: BLE001 — the environment's failure is an answer, not the worker's end
            reply = ("raised", f"{type(err).__name__}: {err}")
        _reply(conn, reply)


def _reply(conn, reply: tuple) -> None:  # pragma: no cover - in the worker
    try:
        conn.send(reply)
    except Exception as err:  # noqa: BLE001 — an answer that does not pickle
        conn.send(("raised", f"the answer could not be sent back ({type(err).__name__}: {err})"))


def _open(envs: dict, cls, eid: int, row: dict) -> tuple[str, object]:  # pragma: no cover - in the worker
    """A new instance for episode ``eid``, reset with ``row``: ("ok", extra text | None) or ("raised", why)."""
    envs.pop(eid, None)
    name = getattr(cls, "__name__", "environment")
    try:
        env = cls()
    except Exception as err:  # noqa: BLE001
        return "raised", f"{name}() raised {type(err).__name__}: {err}"
    try:
        extra = env.reset(**row)
    except Exception as err:  # noqa: BLE001
        return "raised", f"{name}.reset raised {type(err).__name__}: {err}"
    envs[eid] = env
    return "ok", (extra if isinstance(extra, str) and extra else None)


def _run(envs: dict, cls, op: str, eid: int, args: tuple, max_chars: int):  # pragma: no cover - in the worker
    env = envs[eid]
    if op == "call":
        name, positional, arguments = args
        return clip_text(str(getattr(env, name)(*positional, **arguments)), max_chars)
    if op == "reward":
        fn = getattr(env, "get_reward", None)
        return None if not callable(fn) else float(fn())
    if op == "state":
        fn = getattr(env, "observation_key", None)
        return None if not callable(fn) else str(fn())
    raise ValueError(f"unknown request {op!r}")


def start_method(cls) -> str:
    """``forkserver`` for a class a fresh process can import by name, else ``fork`` (module docstring)."""
    if getattr(cls, "__module__", "__main__") == "__main__":
        return "fork"
    try:
        pickle.dumps(cls)  # by reference: module + qualified name, the way the fork server's worker gets it
    except Exception:  # noqa: BLE001 — a local class, a lambda, anything pickle refuses
        return "fork"
    return "forkserver"


class EnvWorker:
    """The worker process of one environment class, and the replay record of its live episodes.
    Thread-safe: one request at a time (an eval and the async producer may share it)."""

    def __init__(self, cls, timeout: float, max_chars: int):
        self.cls, self.timeout, self.max_chars = cls, timeout, max_chars
        self.lock = threading.Lock()
        self.histories: dict[int, _History] = {}
        self.lost_reasons: dict[int, str] = {}
        self.dropped: list[int] = []  # episodes closed by the garbage collector: dropped at the next request
        self.restarts = 0
        self.start_method = start_method(cls)
        self._next = 0
        self._proc = self._conn = None
        self._finalizer = None

    def new_id(self) -> int:
        with self.lock:
            self._next += 1
            return self._next

    # -- requests ---------------------------------------------------------------------------------
    def open(self, eid: int, row: dict) -> tuple[str, object]:
        """``cls()`` and ``reset(**row)`` for episode ``eid``: ("ok", extra text | None) or (kind, why)."""
        with self.lock:
            status, value = self._ask(("open", eid, (row,)))
            if status == "ok":
                self.histories[eid] = _History(dict(row))
            return status, value

    def call(self, eid: int, name: str, positional: tuple, arguments: dict) -> tuple[str, object]:
        """One tool call: ("ok", (text, truncated)) or (raised | timeout | died | lost, why)."""
        with self.lock:
            if eid not in self.histories:
                return "lost", self.lost_reasons.get(eid, "the episode's environment is gone")
            status, value = self._ask(("call", eid, (name, positional, arguments)), eid)
            if status in ("ok", "raised") and eid in self.histories:  # it ran: part of the state to replay
                self.histories[eid].calls.append((name, positional, arguments))
            return status, value

    def query(self, eid: int, op: str) -> tuple[str, object]:
        """``reward`` (get_reward) or ``state`` (observation_key) of episode ``eid``."""
        with self.lock:
            if eid not in self.histories:
                return "lost", self.lost_reasons.get(eid, "the episode's environment is gone")
            return self._ask((op, eid, ()), eid)

    def close(self, eid: int) -> None:
        """The episode is over: drop its instance (and its record)."""
        with self.lock:
            self.lost_reasons.pop(eid, None)
            if self.histories.pop(eid, None) is not None and self._alive():
                self._send(("drop", eid, ()))

    def lost(self, eid: int) -> str | None:
        return self.lost_reasons.get(eid)

    def shutdown(self) -> None:
        with self.lock:
            self._kill()

    # -- the process ---------------------------------------------------------------------------------
    def _ask(self, request: tuple, caller: int | None = None) -> tuple[str, object]:
        """Send ``request`` and wait at most ``timeout`` for the answer; a worker past it is killed
        and restarted, the live episodes replayed (``caller``'s without this request)."""
        self._start()
        self._flush_dropped()
        if not self._send(request) or not self._conn.poll(self.timeout):
            status = "died" if not self._alive() else "timeout"
            self._restart(caller)
            return status, None
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._restart(caller)
            return "died", None

    def _send(self, request: tuple) -> bool:
        try:
            self._conn.send(request)
            return True
        except (OSError, ValueError):  # a broken pipe: the worker is gone
            return False

    def _flush_dropped(self) -> None:
        while self.dropped:
            eid = self.dropped.pop()
            if self.histories.pop(eid, None) is not None:
                self._send(("drop", eid, ()))

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _start(self) -> None:
        if self._alive():
            return
        if self.start_method == "forkserver" and not self._spawn("forkserver"):
            self.start_method = "fork"  # the fresh worker could not load the class: a copy of the trainer can
        if self.start_method == "fork" and not self._spawn("fork"):
            raise RuntimeError(f"the worker of environment {getattr(self.cls, '__name__', self.cls)!r} did not start")

    def _spawn(self, method: str) -> bool:
        """Start a worker by ``method`` and wait until it says it is ready."""
        ctx = multiprocessing.get_context(method)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, parent if method == "fork" else None, self.cls,
                                                self.max_chars), daemon=True,
                           name=f"env-{getattr(self.cls, '__name__', 'environment')}")
        proc.start()
        child.close()
        try:
            ready = parent.poll(STARTUP_TIMEOUT) and parent.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            _kill(proc, parent)
            return False
        self._proc, self._conn = proc, parent
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _kill, proc, parent)
        return True

    def _kill(self) -> None:
        if self._proc is not None:
            _kill(self._proc, self._conn)
        self._proc = self._conn = None

    def _restart(self, caller: int | None) -> None:
        """A new worker, every live episode rebuilt in it by replay; an episode whose replay fails is lost."""
        self._kill()
        self.restarts += 1
        pending = list(self.histories)
        while pending:
            self._start()
            eid = pending.pop(0)
            if not self._replay(eid):
                self._kill()  # a replay that timed out left the worker busy: start clean for the others

    def _replay(self, eid: int) -> bool:
        history = self.histories[eid]
        for request in [("open", eid, (history.row,))] + [("call", eid, c) for c in history.calls]:
            try:
                if not self._send(request) or not self._conn.poll(self.timeout):
                    return self._lose(eid, "its environment could not be rebuilt after a tool call timed out "
                                      "(replaying its calls ran past rollout.tool_timeout)")
                status, value = self._conn.recv()
            except (EOFError, OSError):
                return self._lose(eid, "its environment could not be rebuilt after a tool call timed out "
                                  "(the worker died replaying its calls)")
            if request[0] == "open" and status != "ok":
                return self._lose(eid, f"its environment could not be rebuilt after a tool call timed out "
                                  f"(reset raised {value})")
        return True

    def _lose(self, eid: int, why: str) -> bool:
        self.histories.pop(eid, None)
        self.lost_reasons[eid] = why
        return False


def _kill(proc, conn) -> None:
    """Stop a worker now (SIGKILL: it may be inside a call that never returns) and reap it."""
    try:
        conn.close()
    except OSError:
        pass
    if proc.is_alive():
        proc.kill()
    proc.join(5)
