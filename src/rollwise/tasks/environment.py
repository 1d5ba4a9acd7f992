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
Tools run in the training process, each call in a worker thread bounded by
``rollout.tool_timeout``: a tool that raises, hangs or returns something huge becomes an error
or truncated message to the model, never a crash (a hung call's thread is abandoned, so code
that may hang for good or must be isolated belongs in the sandbox, as ``python_tool`` does).
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rollwise.config import ConfigError
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
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"rollout.environment: cannot import module {module_name!r} ({err})") from None
    cls = getattr(module, attr, None)
    if cls is None or not callable(cls):
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


class EnvironmentFailed(RuntimeError):
    """The environment itself failed where no model output is involved (``reset``)."""


class EpisodeEnv:
    """One environment instance as an episode loop drives it (``generate/episode.py``): its tools'
    schemas, contained tool calls, its reward and anchor state, each failure a message or a 0."""

    done = False  # the environment ended the episode (an OpenEnv observation's done; tasks/openenv.py)

    def __init__(self, env, timeout: float, max_chars: int, schemas: dict[str, Tool] | None = None):
        """``schemas``: the class's tools from ``tools_of`` on another instance, bound to this one
        (schemas are built once per run, not per episode); None = built here."""
        self.env, self.timeout, self.max_chars = env, timeout, max_chars
        self.tools = tools_of(env) if schemas is None else {
            name: Tool(name, getattr(env, name), t.schema) for name, t in schemas.items()}

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def reset(self, row: dict) -> str | None:
        """Start an episode; a ``reset`` that raises is the environment's bug: an error naming it
        (the model has done nothing yet, so there is no episode to score 0)."""
        try:
            extra = self.env.reset(**row)
        except Exception as err:
            raise EnvironmentFailed(f"{type(self.env).__name__}.reset raised {type(err).__name__}: {err} (on a row "
                                    f"with columns {sorted(row)})") from err
        return extra if isinstance(extra, str) and extra else None

    def call(self, call: ToolCall) -> "ToolResult":
        return call_tool(self.tools, call, self.timeout, self.max_chars)

    def reward(self) -> float | None:
        """``get_reward()`` if the environment scores episodes; a raising one scores 0 (never a crash)."""
        if not callable(getattr(self.env, "get_reward", None)):
            return None
        try:
            return float(self.env.get_reward())
        except Exception:  # the environment's bug, not the run's: this episode scores 0
            return 0.0

    def state(self) -> str | None:
        """``observation_key()`` if the environment gives anchor states (None when it raises)."""
        if not callable(getattr(self.env, "observation_key", None)):
            return None
        try:
            return str(self.env.observation_key())
        except Exception:
            return None


def episode_parts(rollout, tokenizer) -> tuple[Callable[[], EpisodeEnv], object]:
    """``rollout.environment`` and ``rollout.tool_format`` (a ``RolloutConfig``) as what an
    ``EpisodeSampler`` takes: a factory of ``EpisodeEnv``s and the ``ToolFormat``."""
    from rollwise.tasks.tool_calls import tool_format

    try:
        fmt = tool_format(rollout.tool_format, tokenizer)
    except ValueError as err:
        raise ConfigError(f"rollout.tool_format: {err}") from None
    return episode_envs(rollout.environment, rollout.tool_timeout, rollout.tool_output_chars), fmt


def episode_envs(spec: str, timeout: float, max_chars: int) -> Callable[[], EpisodeEnv]:
    """``rollout.environment`` as a factory of ``EpisodeEnv``s (checked now: one instance is built)."""
    cls = load_environment(spec)
    if spec.startswith("openenv:"):  # an OpenEnvServer: its episodes are sessions with it (tasks/openenv.py)
        return cls.episodes(timeout, max_chars)
    schemas = tools_of(cls())  # once, and its errors at config time, not mid-run
    return lambda: EpisodeEnv(cls(), timeout, max_chars, schemas)


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model is shown
    error: str | None = None  # a kind: parse, unknown_tool, bad_arguments, raised, timeout (None = ran)
    truncated: bool = False


def call_tool(tools: dict[str, Tool], call: ToolCall, timeout: float, max_chars: int) -> ToolResult:
    """Run one call; every failure is a message to the model with its kind in ``error``."""
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
    if len(text) <= max_chars:
        return ToolResult(text)
    return ToolResult(text[:max_chars] + f"... [{len(text) - max_chars} more characters cut]", truncated=True)
