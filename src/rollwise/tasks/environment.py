"""Environments for multi-turn episodes: TRL's ``environment_factory`` contract (issue 24).

An environment is a class; one instance serves one episode at a time:

- ``reset(**row) -> str | None`` starts an episode from a dataset row (the prompt's columns);
  a returned string is appended to the prompt's last user message.
- Its other public methods are the **tools**: name, docstring (Google style, with an
  ``Args:`` section) and type hints become the tool schema the chat template shows the model
  (``transformers.utils.get_json_schema``, as TRL does).
- Optional ``get_reward() -> float``: the environment scores the episode (a reward component
  named ``environment``, beside the task's reward functions).
- Optional ``observation_key() -> str``: a key for the state the next action is taken from,
  equal across episodes exactly when the state is the same (GiGPO's anchor states).

``rollout.environment`` names one: ``package.module:Class`` or a built-in (``ENVIRONMENTS``).

Guarantees (docs/environments.md):

- The environment's methods run in its worker process (``tasks/env_worker.py``, one per
  sampler; each episode's instance lives there): a call ends at ``rollout.tool_timeout``
  whatever it does — a big-int power or a pure-Python loop is killed with the worker, which is
  restarted with every live episode rebuilt by replay. A class that bounds its own time says
  ``in_process = True`` and runs here, each call in a thread (``python_tool``: the sandbox).
- A tool that raises, hangs or returns something huge is an error or truncated message to
  the model, never a crash.
- The environment's own failures — its constructor, ``reset`` or ``get_reward`` raising, its
  instance lost — set ``failure`` on the episode's environment: the episode ends and scores 0
  with that reason (``Rollout.failure``), and is not trained. Only a class that cannot be built
  at all is an error, a ``ConfigError`` at load.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rollwise.config import ConfigError
from rollwise.tasks.env_worker import clip_text
from rollwise.tasks.tool_calls import ToolCall

ENVIRONMENTS = {
    "python_tool": "rollwise.tasks.envs:PythonTool",
    "calculator": "rollwise.tasks.envs:Calculator",
    "guess_number": "rollwise.tasks.envs:GuessNumber",
}
RESERVED = ("reset", "get_reward", "observation_key")


def load_environment(spec: str) -> Callable[[], object]:
    """``rollout.environment`` → the class (a factory of instances); checks it has ``reset``.
    ``openenv:<url>`` → a ``tasks.openenv.OpenEnvServer``, checked to answer now."""
    if spec.startswith("openenv:"):  # an OpenEnv server (tasks/openenv.py)
        from rollwise.tasks.openenv import OpenEnvServer

        return OpenEnvServer(spec)
    target = ENVIRONMENTS.get(spec, spec)
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"rollout.environment: {spec!r} is neither a built-in ({', '.join(ENVIRONMENTS)}) nor "
                          "'package.module:Class'")
    from rollwise.imports import import_spec  # the working directory and the recipe's are importable

    cls = import_spec(target, "rollout.environment", what="class")
    if not callable(cls):
        raise ConfigError(f"rollout.environment: module {module_name!r} has no class {attr!r}")
    if not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"rollout.environment: {spec!r} has no reset(**row) method (TRL's environment contract)")
    return cls


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    schema: dict  # {"type": "function", "function": {name, description, parameters}}


def tools_of(env) -> dict[str, Tool]:
    """The environment's public methods but ``RESERVED``, as tools with their JSON schemas."""
    from transformers.utils import get_json_schema

    tools = {}
    for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction):
        if name.startswith("_") or name in RESERVED:
            continue
        fn = getattr(env, name)
        try:
            schema = get_json_schema(fn)
        except Exception as err:  # transformers raises its own DocstringParsingException / TypeHintParsingException
            raise ConfigError(f"environment tool {type(env).__name__}.{name}: cannot build its schema ({err}); give it "
                              "type hints and a Google-style docstring with an Args: section") from None
        tools[name] = Tool(name, fn, schema)
    return tools


class EpisodeEnv:
    """One environment instance in this process, as an episode loop drives it (``generate/episode.py``):
    its tools' schemas, contained tool calls (a thread bounded by ``timeout``), its reward and anchor
    state. For environments that bound their own run time (``in_process = True``: ``python_tool``,
    whose code runs in the sandbox) and for tests; others run in a worker (``WorkerEpisodeEnv``).

    Failures of the environment itself (its constructor, ``reset`` or ``get_reward`` raising) set
    ``failure``: the episode ends and scores 0 with that reason (``Rollout.failure``)."""

    done = False  # the environment ended the episode (an OpenEnv observation's done; tasks/openenv.py)

    def __init__(self, env, timeout: float, max_chars: int, schemas: dict[str, Tool] | None = None,
                 failure: str | None = None):
        """``schemas``: the class's tools from ``tools_of`` on another instance, bound to this one
        (schemas are built once per run, not per episode); None = built here. ``env`` None with a
        ``failure``: the constructor raised."""
        self.env, self.timeout, self.max_chars, self.failure = env, timeout, max_chars, failure
        self.tools = tools_of(env) if schemas is None else {
            name: Tool(name, getattr(env, name, t.fn), t.schema) for name, t in schemas.items()}

    @classmethod
    def build(cls, env_cls, timeout: float, max_chars: int, schemas: dict[str, Tool], make=None) -> "EpisodeEnv":
        """``make()`` (default ``env_cls()``) as an episode's environment; a constructor that raises is a
        failed episode."""
        try:
            env = (make or env_cls)()
        except Exception as err:  # the environment's bug: this episode scores 0, the run goes on
            return cls(None, timeout, max_chars, schemas, failure=_failed(env_cls, "the constructor", err))
        return cls(env, timeout, max_chars, schemas)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def reset(self, row: dict) -> str | None:
        """Start an episode; a ``reset`` that raises is the environment's bug: ``failure`` names it and the row."""
        if self.failure is not None:
            return None
        try:
            extra = self.env.reset(**row)
        except Exception as err:
            self.failure = _failed(type(self.env), "reset", err, row)
            return None
        return extra if isinstance(extra, str) and extra else None

    def call(self, call: ToolCall) -> "ToolResult":
        if self.failure is not None:
            return ToolResult(f"Error: the environment failed: {self.failure}"[: self.max_chars], "raised")
        return call_tool(self.tools, call, self.timeout, self.max_chars)

    def reward(self) -> float | None:
        """``get_reward()`` if the environment scores episodes; one that raises fails the episode (0, with why)."""
        if self.failure is not None or not callable(getattr(self.env, "get_reward", None)):
            return None
        try:
            return float(self.env.get_reward())
        except Exception as err:  # the environment's bug, not the run's: this episode scores 0
            self.failure = _failed(type(self.env), "get_reward", err)
            return None

    def state(self) -> str | None:
        """``observation_key()`` if the environment gives anchor states (None when it raises)."""
        if self.failure is not None or not callable(getattr(self.env, "observation_key", None)):
            return None
        try:
            return str(self.env.observation_key())
        except Exception:
            return None

    def close(self) -> None:
        """The episode is over (nothing to free in process)."""


class WorkerEpisodeEnv:
    """One episode's environment instance, living in the class's worker process (``tasks/env_worker.py``),
    with ``EpisodeEnv``'s interface: every method ends within ``timeout`` whatever the environment does."""

    done = False

    def __init__(self, worker, timeout: float, max_chars: int, tools: dict[str, Tool]):
        self.worker, self.timeout, self.max_chars, self.tools = worker, timeout, max_chars, tools
        self.eid = worker.new_id()
        self._failure: str | None = None
        self._open = False

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    @property
    def failure(self) -> str | None:
        """Why the episode's environment failed (None: it did not); the episode scores 0 with it."""
        return self._failure or self.worker.lost(self.eid)

    def reset(self, row: dict) -> str | None:
        status, value = self.worker.open(self.eid, row)
        self._open = status == "ok"
        if status != "ok":
            said = value if status == "raised" else f"{self.worker.cls.__name__}.reset {_STATUS[status]}"
            self._failure = f"{said} (on a row with columns {sorted(row)})"
            return None
        return value

    def call(self, call: ToolCall) -> "ToolResult":
        """One call, checked here (parse errors, unknown tools, arguments) and run in the worker."""
        if self.failure is not None:
            return ToolResult(f"Error: the environment failed: {self.failure}"[: self.max_chars], "raised")
        checked = check_call(self.tools, call)
        if checked is not None:
            return checked
        status, value = self.worker.call(self.eid, call.name, tuple(call.positional), dict(call.arguments))
        if status == "ok":
            text, truncated = value
            return ToolResult(text, truncated=truncated)
        if status == "raised":
            return ToolResult(f"Error: {call.name} raised {value}"[: self.max_chars], "raised")
        if status == "timeout":
            return ToolResult(f"Error: {call.name} timed out after {self.timeout:g} s", "timeout")
        return ToolResult(f"Error: {call.name} {_STATUS.get(status, 'failed')}"[: self.max_chars], "raised")

    def reward(self) -> float | None:
        if self.failure is not None or not callable(getattr(self.worker.cls, "get_reward", None)):
            return None
        status, value = self.worker.query(self.eid, "reward")
        if status != "ok":
            self._failure = f"{self.worker.cls.__name__}.get_reward " + (
                f"raised {value}" if status == "raised" else _STATUS.get(status, "failed"))
            return None
        return value

    def state(self) -> str | None:
        if self.failure is not None or not callable(getattr(self.worker.cls, "observation_key", None)):
            return None
        status, value = self.worker.query(self.eid, "state")
        return value if status == "ok" else None

    def close(self) -> None:
        """Drop the instance in the worker (the episode is over)."""
        if self._open:
            self._open = False
            self.worker.close(self.eid)

    def __del__(self):  # an episode dropped without close(): freed at the worker's next request (no lock here)
        if getattr(self, "_open", False):
            self.worker.dropped.append(self.eid)


_STATUS = {"timeout": "ran past rollout.tool_timeout (its worker process was restarted)",
           "died": "killed its worker process (it was restarted)", "lost": "was lost with its worker process"}


def _failed(env_cls, what: str, err: Exception, row: dict | None = None) -> str:
    """Why an environment failed: ``Name.what raised Kind: message`` (and the row's columns)."""
    name = getattr(env_cls, "__name__", str(env_cls))
    where = f"{name}()" if what == "the constructor" else f"{name}.{what}"
    on = f" (on a row with columns {sorted(row)})" if row is not None else ""
    return f"{where} raised {type(err).__name__}: {err}"[:1000] + on


def episode_parts(rollout, tokenizer, sandbox=None) -> tuple[Callable[[], object], object]:
    """``rollout.environment`` and ``rollout.tool_format`` (a ``RolloutConfig``) as what an
    ``EpisodeSampler`` takes: a factory of episode environments and the ``ToolFormat``. ``sandbox``:
    the run's ``filter.sandbox.Sandbox``, for environments that run code in it (``python_tool``)."""
    from rollwise.tasks.tool_calls import tool_format

    try:
        fmt = tool_format(rollout.tool_format, tokenizer)
    except ValueError as err:
        raise ConfigError(f"rollout.tool_format: {err}") from None
    return episode_envs(rollout.environment, rollout.tool_timeout, rollout.tool_output_chars, sandbox), fmt


def episode_envs(spec: str, timeout: float, max_chars: int, sandbox=None) -> Callable[[], object]:
    """``rollout.environment`` as a factory of episode environments (checked now: one instance is built
    for the tools' schemas). A class runs in a worker process (``WorkerEnvs``) unless it says
    ``in_process = True`` (it bounds its own run time, as ``python_tool``'s sandbox does). A class that
    says ``uses_sandbox = True`` is built as ``cls(sandbox=...)`` with ``sandbox`` (None: a default one),
    started now: a sandbox that cannot start here is a ConfigError naming the fix."""
    cls = load_environment(spec)
    if spec.startswith("openenv:"):  # an OpenEnvServer: its episodes are sessions with it (tasks/openenv.py)
        return cls.episodes(timeout, max_chars)
    make = cls
    if getattr(cls, "uses_sandbox", False):
        started = started_sandbox(sandbox, spec)
        make = lambda: cls(sandbox=started)  # noqa: E731
    try:
        probe = make()
    except Exception as err:
        raise ConfigError(f"rollout.environment: {spec!r}: {_failed(cls, 'the constructor', err)}") from None
    schemas = tools_of(probe)  # once, and its errors at config time, not mid-run
    if getattr(cls, "in_process", False):
        return lambda: EpisodeEnv.build(cls, timeout, max_chars, schemas, make)
    return WorkerEnvs(cls, timeout, max_chars, schemas)


def started_sandbox(sandbox, spec: str):
    """``sandbox`` (None: a one-worker default, closed at exit) with its workers started, or a ConfigError
    saying why it cannot start here and the fix (install bubblewrap, or sandbox.isolation=best_effort)."""
    import atexit

    from rollwise.filter.sandbox import Sandbox, SandboxConfig, SandboxUnavailable

    if sandbox is None:
        sandbox = Sandbox(SandboxConfig(workers=1))
        atexit.register(sandbox.close)
    try:
        sandbox.pool  # noqa: B018 — starting the workers is the point
    except SandboxUnavailable as err:
        raise ConfigError(f"rollout.environment={spec} runs the model's code in the run's sandbox, which cannot "
                          f"start here: {err}") from None
    return sandbox


class WorkerEnvs:
    """A factory of ``WorkerEpisodeEnv``s sharing one worker process (started at the first episode)."""

    def __init__(self, cls, timeout: float, max_chars: int, schemas: dict[str, Tool]):
        from rollwise.tasks.env_worker import EnvWorker

        self.cls, self.tools = cls, schemas
        self.worker = EnvWorker(cls, timeout, max_chars)

    def __call__(self) -> WorkerEpisodeEnv:
        return WorkerEpisodeEnv(self.worker, self.worker.timeout, self.worker.max_chars, self.tools)


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model is shown
    error: str | None = None  # a kind: parse, unknown_tool, bad_arguments, raised, timeout (None = ran)
    truncated: bool = False


def check_call(tools: dict[str, Tool], call: ToolCall) -> ToolResult | None:
    """The error message for a call that cannot run (unreadable, unknown tool, wrong arguments); None = it can."""
    if call.error is not None:
        return ToolResult(f"Error: {call.error}", "parse")
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"Error: unknown tool {call.name!r}; the tools are {', '.join(sorted(tools))}",
                          "unknown_tool")
    try:
        inspect.signature(tool.fn).bind(*call.positional, **call.arguments)
    except TypeError as err:
        return ToolResult(f"Error: wrong arguments for {call.name}: {err}", "bad_arguments")
    return None


def call_tool(tools: dict[str, Tool], call: ToolCall, timeout: float, max_chars: int) -> ToolResult:
    """Run one call in a thread of this process; every failure is a message to the model with its kind
    in ``error``. A call past ``timeout`` is abandoned, not stopped: only for tools that bound their own
    time (``in_process``); others run in a worker process (``WorkerEpisodeEnv``)."""
    checked = check_call(tools, call)
    if checked is not None:
        return checked
    tool = tools[call.name]
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = tool.fn(*call.positional, **call.arguments)
        except Exception as err:  # the tool's failure is the model's information, not ours
            box["error"] = f"{type(err).__name__}: {err}"

    worker = threading.Thread(target=run, daemon=True, name=f"tool-{call.name}")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return ToolResult(f"Error: {call.name} timed out after {timeout:g} s", "timeout")
    if "error" in box:
        return ToolResult(f"Error: {call.name} raised {box['error']}"[:max_chars], "raised")
    return clip(str(box.get("value")), max_chars)


def clip(text: str, max_chars: int) -> ToolResult:
    """``text`` cut to ``max_chars`` characters, saying how much was cut."""
    cut, truncated = clip_text(text, max_chars)
    return ToolResult(cut, truncated=truncated)
