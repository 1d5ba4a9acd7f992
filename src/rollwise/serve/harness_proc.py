"""The harness worker: agent code runs in a process of its own, so it cannot stall the engine.

A harness is user code on an event loop: a synchronous HTTP call, a ``time.sleep`` or a CPU loop
inside it blocks that loop, and in the training process it would also hold the engine's
interpreter lock and keep ``asyncio.wait_for`` from ever firing. So ``HarnessWorker`` runs the
harness in a child process (this file run as a script: nothing of the parent's ``__main__`` is
re-run, and the engine's imports are not paid again), started on first use and reused across
steps. The parent keeps the clock:

- the child imports the harness by its ``module:function`` spec with the parent's ``sys.path``
  (the working directory and whatever the run added to it import there as they do here);
- a batch of episodes goes over a pipe (rows pickled); each episode's ``(tag, reward, reason)``
  comes back as soon as it ends, so one stuck episode loses only itself and what shares its loop;
- the child ends an episode at ``timeout`` itself when its loop is free (``asyncio.wait_for``);
  when it does not answer by ``timeout + grace`` the parent fails what is left of the batch
  and kills the child (its whole process group); the next batch starts a new one;
- the child exits when its parent does (EOF on the pipe, or a watchdog thread that sees the
  parent gone while the harness blocks the loop).

The protocol uses two dedicated pipes (not stdin/stdout), so a harness that prints is harmless.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection

START_TIMEOUT = 120.0  # seconds for a new worker to import the harness and say it is ready


def import_harness(spec: str):
    """``package.module:function`` → the function (a ``ValueError`` saying why not)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import module {module_name!r} ({err})") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ValueError(f"{spec!r} must be an `async def {attr}(client, row)` "
                         "(it gets an openai.AsyncOpenAI client and the dataset row)")
    return fn


def spec_of(harness) -> str:
    """The ``module:function`` spec a child process imports ``harness`` by (a spec string is kept)."""
    if isinstance(harness, str):
        return harness
    module, name = getattr(harness, "__module__", None), getattr(harness, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:
        raise ValueError(f"the harness {name or harness!r} must be importable by name (a module-level "
                         "`async def` in a module, not in the script run as __main__ or inside a function): "
                         "it runs in a process of its own")
    return f"{module}:{name}"


class HarnessWorker:
    """The parent's handle on one harness process: ``start``, ``submit`` a batch, ``results``, ``kill``."""

    def __init__(self, spec: str):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._inbox: queue.Queue = queue.Queue()
        self.starts = 0  # processes started (a restart after a kill counts)
        self.returncode: int | None = None  # the last process's, once it has ended (negative: killed by a signal)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process and wait until it has imported the harness; a ``RuntimeError`` says why not."""
        self.kill()
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        # this file run as a script: the child imports neither rollwise's packages (torch, the engine) nor
        # the parent's __main__
        boot = f"import runpy, sys; sys.argv = ['harness_proc', '{p2c_r}', '{c2p_w}']; " \
               f"runpy.run_path({__file__!r}, run_name='__main__')"
        self.proc = subprocess.Popen([sys.executable, "-c", boot], pass_fds=(p2c_r, c2p_w), env=env,
                                     start_new_session=True)
        os.close(p2c_r)
        os.close(c2p_w)  # the child holds the only write end: its death is EOF here
        self.starts += 1
        self._send = Connection(p2c_w, readable=False)
        self._inbox = queue.Queue()
        threading.Thread(target=_read, args=(Connection(c2p_r, writable=False), self._inbox),
                         name="rollwise-harness-reader", daemon=True).start()
        self._send.send(("init", {"spec": self.spec, "sys_path": list(sys.path), "cwd": os.getcwd()}))
        try:
            kind, body = self._inbox.get(timeout=START_TIMEOUT)
        except queue.Empty:
            kind, body = "error", f"it did not start within {START_TIMEOUT:g} s"
        if kind != "ready":
            self.kill()
            raise RuntimeError(f"the harness process for {self.spec!r} failed: {body or 'it exited'}")

    def submit(self, episodes: list[tuple[str, str, bytes]], timeout: float, api_key: str) -> None:
        """Run ``(tag, base_url, pickled row)`` episodes; ``results()`` hands back each one's outcome
        (rows go pickled one by one: a row the child cannot unpickle fails its episode, not the batch)."""
        batch = ("batch", {"episodes": episodes, "timeout": timeout, "api_key": api_key})
        if not self.alive:
            self.start()
        try:
            self._send.send(batch)
        except OSError:  # it died since it was last seen alive: a new one runs the batch
            self.start()
            self._send.send(batch)

    def results(self) -> tuple[list[tuple[str, float | None, str]], bool]:
        """What came back since the last call (never blocks), and whether the process has ended."""
        out, ended = [], False
        while True:
            try:
                kind, body = self._inbox.get_nowait()
            except queue.Empty:
                return out, ended
            if kind == "result":
                out.append(body)
            elif kind == "exit":
                ended = True

    def kill(self, wait: float = 0.0) -> None:
        """End the process and everything it started (its own process group); ``wait``: seconds to let
        it end by itself first (one that closed its pipe is exiting: its own exit code says more)."""
        if self.proc is not None:
            if wait:
                try:
                    self.proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.returncode = self.proc.wait(timeout=30)
            self.proc = None
        if self._send is not None:
            self._send.close()
            self._send = None


def _read(conn: Connection, inbox: queue.Queue) -> None:
    """The parent's reader thread: every message of the child, then ("exit", None) at EOF."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError, pickle.UnpicklingError):
        inbox.put(("exit", None))
    finally:
        conn.close()


# -- the child ----------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    inbox, outbox = Connection(int(argv[1]), writable=False), Connection(int(argv[2]), readable=False)
    _exit_with_parent(os.getppid())
    _, init = inbox.recv()
    sys.path[:] = init["sys_path"] + [p for p in sys.path if p not in init["sys_path"]]
    os.chdir(init["cwd"])
    try:
        import openai  # noqa: F401  (fail here, not in every episode)

        harness = import_harness(init["spec"])
    except BaseException as err:  # whatever the harness module does on import
        outbox.send(("error", f"{type(err).__name__}: {err}"))
        return
    outbox.send(("ready", None))
    while True:
        try:
            _, batch = inbox.recv()
        except EOFError:  # the parent closed the pipe: done
            return
        asyncio.run(_run_batch(harness, batch, outbox.send))


def _exit_with_parent(parent: int) -> None:
    """A thread that ends this process once the parent is gone (the harness may block the main thread)."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="rollwise-harness-watchdog", daemon=True).start()


async def _run_batch(harness, batch: dict, send) -> None:
    import openai

    timeout, api_key = batch["timeout"], batch["api_key"]

    async def one(tag: str, url: str, blob: bytes, http) -> None:
        try:
            row = pickle.loads(blob)
        except Exception as err:  # noqa: BLE001 — a class the parent has and this process does not
            send(("result", (tag, None, f"the harness process cannot unpickle the row: {type(err).__name__}: {err}")))
            return
        send(("result", (tag, *await _episode(harness, url, row, http, timeout, api_key))))

    # one connection pool for every episode's client (a client of its own builds an SSL context: ~25 ms each)
    async with openai.DefaultAsyncHttpxClient(timeout=timeout) as http:
        await asyncio.gather(*(one(tag, url, blob, http) for tag, url, blob in batch["episodes"]))


async def _episode(harness, url: str, row: dict, http, timeout: float, api_key: str) -> tuple[float | None, str]:
    """Run the harness on one episode: (its reward, "") or (None, why it failed)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=timeout, http_client=http)
    try:
        reward = await asyncio.wait_for(harness(client, row), timeout)
    except openai.BadRequestError as err:
        if getattr(err, "code", None) == "episode_budget_exhausted":  # the episode ran out of tokens: it ends
            return None, ""
        return None, f"the harness raised {type(err).__name__}: {err}"[:500]
    except asyncio.TimeoutError:
        return None, f"the harness ran past rollout.harness_timeout ({timeout:g} s)"
    except Exception as err:  # a harness must not take training down
        return None, f"the harness raised {type(err).__name__}: {err}"[:500]
    if reward is not None and not isinstance(reward, (int, float)):
        return None, f"the harness returned {type(reward).__name__}, not a float or None"
    return (None if reward is None else float(reward)), ""


if __name__ == "__main__":
    main(sys.argv)
