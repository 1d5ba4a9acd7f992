"""Tool-use demonstrations: SFT examples that are whole episodes (issue 35).

A 135M chat model does not write a tool-call format it was never shown, so RL on episodes
alone finds no call to reinforce (docs/environments.md). The warm start shows it calls, as
people post-train real models for tools: supervised conversations in the model's own chat
format, then RL.

A demonstration of a tool task is a ``Conversation``: the messages after the prompt, in the
OpenAI shape the endpoint reads — an assistant turn with ``tool_calls``, the ``tool`` message
the environment answers with, the final assistant turn in the task's answer format. It names
no tool format and no chat template: the SFT warm start renders it with the run's
(``train/sft.py``, through ``generate/conversation.ChatRenderer``, the one renderer of episodes
and of the endpoint), so an SFT example's ids are the ids an RL episode with the same turns
has — each assistant turn's text then EOS (trained), and between turns the ids the episode
inserts (not trained).

Guarantees:

- the tool result in a calculator demonstration is the real tool's output on the call
  (``Calculator.calculate`` runs here), so it is exactly what the environment inserts in RL;
  a demonstration whose result is not the prompt's answer is not made (``None``);
- a call is written as ``ToolFormat.call_text`` writes it (hermes:
  ``<tool_call>{"name": "calculate", "arguments": {"expression": "347 * 58"}}</tool_call>``),
  except that a one-argument call in a format without a chat template (``plain``) is written
  positionally, ``<call>calculate("347*58")</call>``, as the tiny recipe's demonstrations always
  were — its warm start is unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rollwise.tasks.envs import Calculator
from rollwise.tasks.tool_calls import ToolCall, ToolFormat
from rollwise.types import Prompt


@dataclass(frozen=True)
class Conversation:
    """A demonstration episode after the prompt: OpenAI-shaped messages (assistant turns with
    ``content`` and/or ``tool_calls``, ``tool`` messages with ``name`` and ``content``), ending
    with the final assistant turn."""

    messages: tuple[dict, ...]

    def __post_init__(self) -> None:
        if not self.messages or self.messages[-1].get("role") != "assistant" or self.messages[-1].get("tool_calls"):
            raise ValueError("a demonstration conversation ends with the final assistant turn (no tool calls)")

    def calls(self) -> list[ToolCall]:
        """Every call the assistant turns make, in order."""
        return [ToolCall(c["function"]["name"], dict(c["function"]["arguments"]))
                for m in self.messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()]

    def tool_results(self) -> list[str]:
        """The tool messages' contents, in order (what the environment inserts)."""
        return [m["content"] for m in self.messages if m["role"] == "tool"]

    def written(self, fmt: ToolFormat) -> list[dict]:
        """The messages as text: each assistant turn's calls written out in ``fmt``, as the model writes them."""
        out = []
        for m in self.messages:
            if m["role"] != "assistant":
                out.append(dict(m))
                continue
            calls = "".join(write_call(fmt, c["function"]["name"], c["function"]["arguments"])
                            for c in m.get("tool_calls") or ())
            out.append({"role": "assistant", "content": (m.get("content") or "") + calls})
        return out


def write_call(fmt: ToolFormat, name: str, arguments: dict) -> str:
    """A call as a demonstration writes it in ``fmt`` (see the module docstring for plain's one-argument form)."""
    if not fmt.uses_chat_template and len(arguments) == 1:
        return fmt.call_text(name, json.dumps(next(iter(arguments.values()))))
    return fmt.call_text(name, arguments)


def tool_episode(name: str, arguments: dict, result: str, answer: str) -> Conversation:
    """One call, its result, the final answer: the two-turn episode of a one-tool task."""
    call = {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
    return Conversation(({"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "name": name, "content": result},
                         {"role": "assistant", "content": answer}))


def calculator_episode(expression: str, answer: str, final: str) -> Conversation | None:
    """``calculate(expression)`` with the calculator's real result, then ``final`` (the answer
    written in the task's format); None when the calculator's result is not ``answer``.

    >>> calculator_episode("347*58", "20126", " #20126").tool_results()
    ['20126']
    """
    try:
        result = Calculator().calculate(expression)
    except ValueError:
        return None
    if result != str(answer).strip():
        return None
    return tool_episode("calculate", {"expression": expression}, result, final)


def expression_of(prompt: Prompt) -> str | None:
    """The arithmetic a prompt asks for, when its row says it (reasoning-gym's ``metadata.expression``:
    ``basic_arithmetic``, ``chain_sum``, ``products``)."""
    metadata = prompt.columns.get("metadata")
    expression = metadata.get("expression") if isinstance(metadata, dict) else None
    return expression if isinstance(expression, str) and expression.strip() else None
