"""The OpenAI chat-completions wire format the endpoint reads and writes (the subset rollwise serves).

Requests are validated with pydantic; unknown OpenAI parameters are accepted and ignored (a
client library sends several). Errors use the shape the ``openai`` client reads
(``{"error": {"message", "type", "param", "code"}}``) with the HTTP status it maps to an
exception: 400 ``BadRequestError``, 404 ``NotFoundError``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ApiError(Exception):
    """An error answered in OpenAI's shape (never a crash of the server)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"  # a JSON object, as text (OpenAI's shape)


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None

    def as_chat(self) -> dict:
        """The message as a chat template reads it (``developer`` is a system message; tool-call
        arguments as objects)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text}
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [{"type": "function", "id": c.id, "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.get("text", "") for p in self.content if p.get("type", "text") == "text")

    def key(self) -> tuple:
        """What identifies the message for matching a conversation's history (ids aside)."""
        calls = tuple((c.function.name, json.dumps(_arguments(c.function.arguments), sort_keys=True))
                      for c in self.tool_calls or [])
        return ("system" if self.role == "developer" else self.role, self.text.strip(), calls)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1)
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: list[str] = Field(default_factory=list)  # a string or up to 4 (OpenAI's)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    seed: int | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        for i, tool in enumerate(v or []):
            fn = tool.get("function")
            if tool.get("type", "function") != "function" or not isinstance(fn, dict) or not fn.get("name"):
                raise ValueError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                 "'parameters': {...}}}}")
        return v

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def parses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


def _arguments(text: str) -> dict | str:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def envelope(kind: str, cid: str, model: str, version: int) -> dict:
    """The fields every response and chunk carries; ``system_fingerprint`` names the policy version."""
    return {"id": cid, "object": kind, "created": int(time.time()), "model": model,
            "system_fingerprint": f"rollwise-policy-v{version}"}


def token_logprobs(pieces: list[str], logprobs: list[float]) -> dict:
    """OpenAI's ``logprobs`` object for sampled tokens (their text and behaviour log-prob)."""
    return {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode("utf-8")), "top_logprobs": []}
                        for p, lp in zip(pieces, logprobs)]}
