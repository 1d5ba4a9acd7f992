"""OpenEnv environments as multi-turn episodes: ``rollout.environment: openenv:http://HOST:PORT`` (issue 25).

OpenEnv (meta-pytorch/OpenEnv; ``openenv-core`` on PyPI, the ``rollwise[openenv]`` extra) serves an
environment over HTTP and WebSocket (``openenv.core.env_server.http_server.create_app``). A client's
WebSocket (``/ws``) is one session with its own environment instance on the server: ``reset``,
``step(action)``, ``state``; every observation carries ``reward`` and ``done``. An MCP environment
(``MCPEnvironment``) exposes tools: ``step(ListToolsAction)`` lists them, ``step(CallToolAction)``
calls one. This module drives such a server as rollwise's episode contract (``tasks/environment.py``,
the loop in ``generate/episode.py``):

- At load (config time) the address must parse and the server must answer ``/health`` within
  ``CHECK_TIMEOUT`` and list its tools in a session (opened and closed); otherwise a ``ConfigError``
  names ``rollout.environment`` and the fix. The tools' MCP schemas become the shape
  ``transformers.utils.get_json_schema`` gives (``{"type": "function", "function": {name, description,
  parameters}}``; pydantic's ``title``/``additionalProperties`` dropped), so tool formats and chat
  templates see them as they see a Python environment's.
- Each episode opens its own session (its own WebSocket, so its own environment instance): nothing
  is shared between episodes. ``reset`` sends the row's JSON-serialisable columns (the server keeps
  those its ``reset`` accepts); the observation's text (its one string field, else its fields as
  JSON) is appended to the prompt after a blank line.
- A tool call is ``step(CallToolAction)``; the observation's result text is the tool result
  (cut to ``rollout.tool_output_chars``); an error the server reports (unknown tool, invalid
  arguments, a tool that raised or timed out) is a message to the model with rollwise's error kind.
- Every observation's ``reward`` adds to the episode's reward (``reward()``: the component
  ``environment``); ``done`` ends the episode (``EpisodeSampler`` reads ``env.done`` after a turn's calls).
- A server that cannot be reached, closes the connection, or does not answer a step within
  ``rollout.tool_timeout``: the call's result is an error message, the session is closed, the
  episode ends and scores ``Score(0.0, reason)``. Nothing raises into the training loop.

Where we depart from OpenEnv's own clients:

1. We use ``GenericEnvClient`` (raw dicts), not ``MCPToolClient``: the latter keeps only ``done``,
   ``reward`` and ``metadata`` of a non-tool observation, and ``reset``'s text is what we need.
2. A step that times out ends the episode: the socket would deliver the late answer as the next
   one, and OpenEnv's client has no way to skip it.
3. One event-loop thread per run holds every session (OpenEnv's ``.sync()`` starts one per client).
4. No anchor states (``state()`` is None): OpenEnv's ``state`` is an episode id and a step count, not
   a key equal across episodes exactly when their states are equal, so ``gigpo`` sees none.
5. Only MCP tools are actions, sent through ``step``: a server made with its own action model
   (``create_app(Env, EchoAction, ...)``) does not route ``ListToolsAction``/``CallToolAction`` to the
   environment, and is refused at load (its JSON-RPC ``mcp`` messages would reach the tools, but
   without rewards or ``done``). Per-step rewards are summed into the episode's reward, not put on turns.

The server must admit a step's episodes at once: ``create_app(..., max_concurrent_envs=N)`` with the
environment class's ``SUPPORTS_CONCURRENT_SESSIONS = True`` (N ≥ prompts_per_step × num_generations);
a session refused for capacity scores its episode 0 with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.request
from urllib.parse import urlsplit

from rollwise.config import ConfigError
from rollwise.tasks.environment import ToolResult, clip
from rollwise.tasks.tool_calls import ToolCall
from rollwise.types import Score

PREFIX = "openenv:"
CHECK_TIMEOUT = 5.0  # seconds the server has to answer at load
# OpenEnv's ToolErrorType -> rollwise's error kinds (generate/episode.py ERROR_KINDS)
TOOL_ERRORS = {"tool_not_found": "unknown_tool", "invalid_args": "bad_arguments", "timeout": "timeout",
               "execution_error": "raised", "transport_error": "raised"}
log = logging.getLogger(__name__)


def server_url(spec: str) -> str:
    """``openenv:http://127.0.0.1:8000`` -> ``http://127.0.0.1:8000`` (http, https, ws or wss, a host, no query)."""
    url = spec[len(PREFIX):].strip().rstrip("/")
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https", "ws", "wss") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    if not ok or parts.query or parts.fragment:
        raise ConfigError(f"rollout.environment: {spec!r} is not an OpenEnv server address; write "
                          "openenv:http://HOST:PORT, the address the server's create_app app listens on")
    return url


class OpenEnvServer:
    """An OpenEnv server checked at load: its address, its tools' schemas, and the event loop every
    episode's session runs on. ``episodes(timeout, max_chars)`` is the factory ``EpisodeSampler`` takes."""

    def __init__(self, spec: str):
        self.url = server_url(spec)
        self.http = self.url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="openenv-sessions").start()
        self.tools = self._check()  # {name: schema}

    def run(self, coro, timeout: float):
        """Run ``coro`` on the sessions' loop from any thread; ``TimeoutError`` after ``timeout`` seconds."""
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self.loop).result()

    def _check(self) -> dict[str, dict]:
        where = f"rollout.environment: no OpenEnv server answers at {self.url}"
        local = urlsplit(self.url).hostname in ("localhost", "127.0.0.1", "::1")  # no proxy, as OpenEnv's client
        opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if local else []))
        try:
            with opener.open(f"{self.http}/health", timeout=CHECK_TIMEOUT) as response:
                response.read()
        except Exception as err:
            raise ConfigError(f"{where} ({type(err).__name__}: {err}); start it (e.g. `uvicorn server.app:app "
                              "--port PORT`) or fix the address") from None
        episode = OpenEnvEpisode(self, CHECK_TIMEOUT, 0)
        try:
            listed = self.run(episode.open_and(lambda c: c.step({"type": "list_tools"})), CHECK_TIMEOUT)
        except Exception as err:
            raise ConfigError(f"rollout.environment: the OpenEnv server at {self.url} did not list its tools "
                              f"({type(err).__name__}: {err}); rollwise drives MCP environments (MCPEnvironment, "
                              "create_app with CallToolAction)") from None
        finally:
            episode.close()
        tools = {t["name"]: tool_schema(t) for t in listed.observation.get("tools") or []}
        if not tools:
            raise ConfigError(f"rollout.environment: the OpenEnv server at {self.url} lists no MCP tools; the model "
                              "acts through tools, so serve an MCPEnvironment")
        return tools

    def episodes(self, timeout: float, max_chars: int):
        """A factory of episodes: each call opens nothing yet (``reset`` opens the session)."""
        return lambda: OpenEnvEpisode(self, timeout, max_chars)


def tool_schema(tool: dict) -> dict:
    """An MCP tool (``name``, ``description``, ``input_schema``) in ``get_json_schema``'s shape."""
    parameters = _clean(tool.get("input_schema") or tool.get("inputSchema") or {})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                             "parameters": parameters}}


def _clean(schema):
    """A JSON schema without pydantic's ``title``/``additionalProperties`` (which get_json_schema never writes)."""
    if isinstance(schema, list):
        return [_clean(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _clean(v) for k, v in schema.items() if k not in ("title", "additionalProperties", "properties")}
    if isinstance(schema.get("properties"), dict):  # property names are data, not keywords: keep every one
        out["properties"] = {name: _clean(s) for name, s in schema["properties"].items()}
    return out


class OpenEnvEpisode:
    """One episode's session with the server, shaped as ``tasks.environment.EpisodeEnv`` for the loop:
    ``schemas``, ``reset(row)``, ``call(call)``, ``reward()``, ``state()``, and ``done``."""

    def __init__(self, server: OpenEnvServer, timeout: float, max_chars: int):
        self.server, self.timeout, self.max_chars = server, timeout, max_chars
        self.client = None  # openenv's GenericEnvClient, connected by reset
        self.total = 0.0  # the rewards observed so far
        self.done = False  # the environment said done, or the session failed
        self.failure: str | None = None  # why the session failed (the episode scores 0)

    @property
    def schemas(self) -> list[dict]:
        return list(self.server.tools.values())

    async def open_and(self, then):
        """Connect a new session (its own WebSocket) and ``await then(client)``."""
        from openenv.core.generic_client import GenericEnvClient

        self.client = GenericEnvClient(base_url=self.server.url, connect_timeout_s=self.timeout,
                                       message_timeout_s=self.timeout)
        await self.client.connect()
        return await then(self.client)

    def reset(self, row: dict) -> str | None:
        """Open the session and reset it with the row's columns; the observation's text goes after the prompt."""
        columns = {k: v for k, v in row.items() if _jsonable(v)}
        try:
            result = self.server.run(self.open_and(lambda c: c.reset(**columns)), self.timeout)
        except Exception as err:  # the server's failure is this episode's 0, never the run's crash
            self._fail("reset", err)
            return None
        self._observe(result)
        text = observation_text(result.observation)
        return f"\n\n{text}" if text else None

    def call(self, call: ToolCall) -> ToolResult:
        """One tool call as ``step(CallToolAction)``; every failure is a message with its kind."""
        if call.error is not None:
            return ToolResult(f"Error: {call.error}", "parse")
        if self.failure is not None:
            return ToolResult(f"Error: the environment server failed: {self.failure}"[: self.max_chars], "raised")
        if self.done:
            return ToolResult("The episode is over: the environment said done.")
        tool = self.server.tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self.server.tools))
            return ToolResult(f"Error: unknown tool {call.name!r}; the tools are {names}", "unknown_tool")
        try:
            arguments = bind(tool, call)
        except TypeError as err:
            return ToolResult(f"Error: wrong arguments for {call.name}: {err}", "bad_arguments")
        action = {"type": "call_tool", "tool_name": call.name, "arguments": arguments}
        try:
            result = self.server.run(self.client.step(action), self.timeout)
        except RuntimeError as err:  # the server answered with an error message: the session lives on
            return ToolResult(f"Error: {call.name}: {err}"[: self.max_chars], "raised")
        except Exception as err:  # no answer: the server is gone, or too slow to keep the session in step
            self._fail(call.name, err)
            kind = "timeout" if isinstance(err, TimeoutError) else "raised"
            return ToolResult(f"Error: the environment server failed: {self.failure}"[: self.max_chars], kind)
        self._observe(result)
        return self._result(call.name, result.observation)

    def _result(self, name: str, obs: dict) -> ToolResult:
        error = obs.get("error")
        if isinstance(error, dict):
            kind = TOOL_ERRORS.get(str(error.get("error_type")), "raised")
            return ToolResult(f"Error: {name}: {error.get('message', '')}"[: self.max_chars], kind)
        if "tool_name" not in obs:  # not a CallToolObservation: the observation itself is the answer
            return clip(observation_text(obs) or "", self.max_chars)
        result = obs.get("result")
        text = result_text(result)
        if isinstance(result, dict) and result.get("is_error"):
            return ToolResult(f"Error: {name}: {text}"[: self.max_chars], "raised")
        return clip(text, self.max_chars)

    def _observe(self, result) -> None:
        if result.reward is not None:
            self.total += float(result.reward)
        if result.done:
            self.done = True
            self.close()

    def _fail(self, what: str, err: Exception) -> None:
        said = self._last_word() if not isinstance(err, TimeoutError) else None
        self.failure, self.done = f"{what} failed ({said or _describe(err, self.timeout)})", True
        log.warning("OpenEnv server %s: %s; this episode scores 0", self.server.url, self.failure)
        self.close()

    def _last_word(self) -> str | None:
        """The error the server sent before it closed the session (at capacity, say), if one is waiting."""
        ws = getattr(self.client, "_ws", None)  # openenv 0.3.0's connection (private): best effort
        if ws is None:
            return None
        try:
            data = json.loads(self.server.run(ws.recv(), 1.0)).get("data") or {}
            return f"the server said: {data['message']} (code: {data.get('code')})"
        except Exception:
            return None

    def reward(self) -> float:
        """The rewards observed, summed; 0 with the reason when the session failed. Closes the session."""
        self.close()
        if self.failure is not None:
            return Score(0.0, f"OpenEnv server {self.server.url}: {self.failure}")
        return self.total

    def state(self) -> str | None:
        return None  # no anchor states (departure 4)

    def close(self) -> None:
        """End the session (best effort: a dead server has ended it already)."""
        client, self.client = self.client, None
        if client is not None:
            try:
                self.server.run(client.close(), min(self.timeout, CHECK_TIMEOUT))
            except Exception:
                pass

    def __del__(self):  # an episode dropped unscored (a restart that did not replay) still frees its session
        if getattr(self, "client", None) is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.client.close(), self.server.loop)
            except Exception:  # the loop is gone (interpreter exit): so is the connection
                pass


def bind(tool: dict, call: ToolCall) -> dict:
    """The call's arguments by name: positional ones (the ``plain`` format) take the schema's
    parameter order; unknown and missing required ones raise ``TypeError``."""
    parameters = tool["function"]["parameters"]
    names = list(parameters.get("properties", {}))
    if len(call.positional) > len(names):
        raise TypeError(f"takes {len(names)} arguments but {len(call.positional)} were given")
    arguments = dict(zip(names, call.positional))
    for name, value in call.arguments.items():
        if name not in names:
            raise TypeError(f"got an unexpected argument {name!r}")
        if name in arguments:
            raise TypeError(f"got multiple values for argument {name!r}")
        arguments[name] = value
    missing = [n for n in parameters.get("required", []) if n not in arguments]
    if missing:
        raise TypeError(f"missing required arguments {', '.join(map(repr, missing))}")
    return arguments


def observation_text(obs: dict) -> str | None:
    """An observation's text: its one string field, else its non-empty fields as JSON (None: it has none)."""
    fields = {k: v for k, v in (obs or {}).items() if v not in (None, "", [], {})}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if not fields:
        return None
    return strings[0] if len(strings) == 1 else json.dumps(fields, default=str)


def result_text(result) -> str:
    """A tool result's text: a string as is; an MCP ``CallToolResult``'s text contents, else its data."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        texts = [c["text"] for c in result.get("content") or []
                 if isinstance(c, dict) and isinstance(c.get("text"), str)]
        if texts:
            return "\n".join(texts)
        if "data" in result:
            return result_text(result["data"])
    return "" if result is None else json.dumps(result, default=str)


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _describe(err: Exception, timeout: float) -> str:
    if isinstance(err, TimeoutError):
        return f"no answer within {timeout:g} s"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
