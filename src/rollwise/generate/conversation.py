"""Conversations as token ids, token-faithfully: the one renderer of the in-process episodes
(``generate/episode.py``) and of the OpenAI-compatible endpoint (``rollwise.serve``).

A conversation is rendered once, as its first prompt; after that it only grows. What a model
turn sampled is kept as the exact ids it sampled (never decoded and re-tokenized), and what
comes after it — tool results, a next user message — is rendered as the ids the chat template
puts between that turn's end-of-turn token and the next assistant header (``suffix_ids``).
So call k+1's prompt is call k's prompt + completion + the suffix: a trajectory the trainer
can score token by token.

Two renderings, chosen by the tool format (``tasks/tool_calls.py``):

- chat-template formats (``hermes``): the tokenizer's chat template; when the template ignores
  ``tools`` (SmolLM2's, plain ChatML) the tools are given in a system message
  (``fmt.system_prompt``);
- plain formats (models without a chat template, the tiny presets): the system and user texts
  joined by newlines as the prompt, a tool result inserted as ``fmt.result_text``, a later user
  message as its text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ChatRenderer:
    tokenizer: object
    fmt: object  # a tasks.tool_calls.ToolFormat

    def prompt_ids(self, messages: list[dict], schemas: list[dict] | None = None) -> list[int]:
        """A conversation rendered afresh (the first prompt, or a history whose assistant turns are
        text), with the generation prompt."""
        tok = self.tokenizer
        if not self.fmt.uses_chat_template:
            return self._plain_ids(messages)
        messages = [dict(m) for m in messages]
        ids = render(tok, messages, True, tools=schemas or None)
        if schemas and ids == render(tok, messages, True):  # the template ignores tools: say them in a system message
            system = self.fmt.system_prompt(schemas)
            if messages and messages[0]["role"] == "system":
                messages[0]["content"] = _text(messages[0]) + "\n\n" + system
            else:
                messages.insert(0, {"role": "system", "content": system})
            ids = render(tok, messages, True)
        return ids

    def _plain_ids(self, messages: list[dict]) -> list[int]:
        """Plain layout: the system/user texts before the first assistant turn joined by newlines; then
        each assistant turn's text and EOS, and what follows it as ``suffix_ids``."""
        tok = self.tokenizer
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        ids = list(tok("\n".join(_text(m) for m in messages[:first]))["input_ids"])
        i = first
        while i < len(messages):
            ids += list(tok(_text(messages[i]), add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
            j = next((k for k in range(i + 1, len(messages)) if messages[k]["role"] == "assistant"), len(messages))
            ids += self.suffix_ids(messages[i + 1:j]) if j > i + 1 else []
            i = j
        return ids

    def suffix_ids(self, messages: list[dict]) -> list[int]:
        """The ids that follow a sampled assistant turn (ending in its end-of-turn token) when
        ``messages`` (tool results, or a user message) come next, up to the next assistant header."""
        tok = self.tokenizer
        if not self.fmt.uses_chat_template:
            tools = [_text(m) for m in messages if m["role"] == "tool"]
            text = self.fmt.result_text(tools) if tools else ""
            text += "".join(_text(m) for m in messages if m["role"] != "tool")
            return list(tok(text, add_special_tokens=False)["input_ids"])
        return chat_suffix_ids(tok, messages)


def chat_suffix_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids the chat template puts after an assistant turn's end-of-turn token for these
    messages, up to and including the next assistant header: rendered once for a stand-in
    conversation and cut at its last EOS (the sampled turn ends with that EOS)."""
    calls = [{"type": "function", "function": {"name": m.get("name") or "tool", "arguments": {}}}
             for m in messages if m["role"] == "tool"]
    assistant = {"role": "assistant", "content": "", **({"tool_calls": calls} if calls else {})}
    stand_in = [{"role": "user", "content": "x"}, assistant]
    prefix, full = render(tokenizer, stand_in, False), render(tokenizer, stand_in + list(messages), True)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise ValueError("the chat template renders the conversation before the new messages differently once they "
                         "are added: cannot continue it token-faithfully with this template")
    return full[len(prefix):]


def render(tokenizer, messages: list[dict], generation_prompt: bool, tools=None) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _text(message: dict) -> str:
    """A message's content as text (OpenAI content parts: their text parts joined)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))
