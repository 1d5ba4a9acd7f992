"""Tool-call formats: how a model's turn names the tools it calls (multi-turn episodes, issue 24).

A format turns the text of one model turn into the ``ToolCall``s it makes (none = the turn
answers and the episode ends). A call the model botched — unparseable JSON, a missing name,
arguments that are not an object — comes back as a ``ToolCall`` with ``error`` set, so the
environment answers it with an error message instead of the episode crashing. ``parse`` never
raises, whatever the text: a reader that fails in any way (JSON nested past the recursion limit,
a NUL byte ``ast`` refuses, a format's own bug) is that call's ``error``, never an exception.

Supported (``rollout.tool_format``):

- ``hermes`` — Hermes / Qwen2.5 / Qwen3 / SmolLM3 chat templates: each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; several per turn allowed.
  ``arguments`` may also be a JSON string holding the object (some models emit that).
- ``plain`` — for models without a chat template (the tiny character-level presets): each
  call is ``<call>name(arg, key=value)</call>`` with Python literal arguments, read with
  ``ast`` (never evaluated); the result is inserted as ``<result>...</result>``.

Adding a format: subclass ``ToolFormat`` with a ``name``, the ``open``/``close`` markers of a
call and ``_read(body) -> ToolCall`` (or override ``parse(text)`` for a format without markers)
and, for formats without a chat template, ``result_text(results)``; add it to ``FORMATS``.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCall:
    """One call a model turn made: ``name(*positional, **arguments)``; ``error`` = why it could not be read."""

    name: str
    arguments: dict = field(default_factory=dict)
    positional: tuple = ()
    error: str | None = None


class ToolFormat:
    """A call format: calls are the ``open``…``close`` blocks of a turn, each read by ``_read``."""

    name = ""
    uses_chat_template = False  # results go in as tool messages through the tokenizer's chat template
    open, close = "", ""

    def safe_parse(self, text: str) -> list[ToolCall]:
        """``parse_calls(self, text)``: never raises (generate/ reads formats through the object it is
        given and never imports tasks/)."""
        return parse_calls(self, text)

    def parse(self, text: str) -> list[ToolCall]:
        block = re.compile(re.escape(self.open) + "(.*?)(" + re.escape(self.close) + "|$)", re.DOTALL)
        return [self.read(body.strip()) if closed else
                ToolCall("", error=f"a {self.open} without its closing {self.close}")
                for body, closed in block.findall(text)]

    def read(self, body: str) -> ToolCall:
        """``_read(body)``, its failures contained: model output is data, so nothing it holds may raise."""
        try:
            return self._read(body)
        except RecursionError:  # json and ast recurse once per nesting level
            return ToolCall("", error="the tool call is nested too deeply to read")
        except Exception as err:  # noqa: BLE001 — e.g. ast's ValueError on a NUL byte
            return ToolCall("", error=f"cannot read the tool call ({type(err).__name__}: {str(err)[:80]})")

    @staticmethod
    def _read(body: str) -> ToolCall:
        raise NotImplementedError

    def result_text(self, results: list[str]) -> str:
        """Text inserted after a turn's calls (formats without a chat template)."""
        raise NotImplementedError

    def call_text(self, name: str, arguments: dict | str) -> str:
        """A call written the way the model writes it (a conversation rendered afresh from OpenAI messages)."""
        raise NotImplementedError


class Hermes(ToolFormat):
    name = "hermes"
    uses_chat_template = True
    open, close = "<tool_call>", "</tool_call>"

    @staticmethod
    def _read(body: str) -> ToolCall:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            return ToolCall("", error=f"the tool call is not valid JSON ({err.msg} at char {err.pos})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return ToolCall("", error='a tool call must be a JSON object with a "name" string')
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models emit the arguments object as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return ToolCall(obj["name"], error='"arguments" is a string that is not a JSON object')
        if not isinstance(args, dict):
            return ToolCall(obj["name"], error='"arguments" must be a JSON object')
        return ToolCall(obj["name"], args)

    def call_text(self, name: str, arguments: dict | str) -> str:
        return self.open + json.dumps({"name": name, "arguments": arguments}) + self.close

    @staticmethod
    def system_prompt(schemas: list[dict]) -> str:
        """The tools and the call format, as Hermes-style templates render them: for chat templates
        that ignore ``tools`` (SmolLM2's, plain ChatML), given to the model as a system message."""
        listed = "\n".join(json.dumps(s, sort_keys=True) for s in schemas)
        return ("You can call these tools. Their signatures are inside <tools></tools>:\n<tools>\n" + listed
                + "\n</tools>\nTo call one, reply with <tool_call>{\"name\": <tool name>, \"arguments\": "
                "<arguments object>}</tool_call>; its result comes back in a tool message. When you know the answer, "
                "reply without a tool call.")


class Plain(ToolFormat):
    name = "plain"
    open, close = "<call>", "</call>"

    @staticmethod
    def _read(body: str) -> ToolCall:
        try:
            node = ast.parse(body, mode="eval").body
        except SyntaxError:
            return ToolCall("", error=f"cannot read the call {body[:80]!r}: write name(arg, key=value)")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return ToolCall("", error=f"cannot read the call {body[:80]!r}: write name(arg, key=value)")
        try:
            positional = tuple(ast.literal_eval(a) for a in node.args)
            arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        except (ValueError, SyntaxError, TypeError):
            return ToolCall(node.func.id, error="arguments must be literals (numbers, strings, lists, dicts)")
        return ToolCall(node.func.id, arguments, positional)

    def result_text(self, results: list[str]) -> str:
        return "".join(f"<result>{r}</result>" for r in results)

    def call_text(self, name: str, arguments: dict | str) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in arguments.items()) if isinstance(arguments, dict) else arguments
        return f"{self.open}{name}({args}){self.close}"


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (Hermes(), Plain())}


def parse_calls(fmt: ToolFormat, text: str) -> list[ToolCall]:
    """``fmt.parse(text)`` for callers that must not raise (the episode loop, the endpoint): a format
    that overrides ``parse`` and fails anyway gives one call with the error, answered to the model.
    (``ToolFormat.safe_parse`` is the same, for callers outside ``tasks``: the episode loop.)"""
    try:
        return list(fmt.parse(text))
    except RecursionError:
        return [ToolCall("", error="the tool call is nested too deeply to read")]
    except Exception as err:  # noqa: BLE001 — a user format's bug is the model's error message, not a crash
        return [ToolCall("", error=f"cannot read the tool calls ({type(err).__name__}: {str(err)[:80]})")]



def tool_format(name: str, tokenizer) -> ToolFormat:
    """``rollout.tool_format``: a name in ``FORMATS``, or ``auto`` = ``hermes`` when the tokenizer has a
    chat template, else ``plain``."""
    if name == "auto":
        name = "hermes" if getattr(tokenizer, "chat_template", None) else "plain"
    if name not in FORMATS:
        raise ValueError(f"unknown tool format {name!r}; choose one of auto, {', '.join(FORMATS)}")
    fmt = FORMATS[name]
    if fmt.uses_chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"tool format {name!r} inserts tool results through the chat template, and this tokenizer "
                         "has none; use rollout.tool_format=plain")
    return fmt
