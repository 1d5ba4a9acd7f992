"""The endpoint's record of an episode (its calls and choices) and what each episode may use.

Guaranteed, per tag:

- **Call indices** are taken when a call *starts* (``EpisodeLog.started``), so calls in flight at
  once never share one (call k samples with ``derive(*key, k)``); calls are kept in index order
  whatever order they finish in, so a rebuilt trajectory does not depend on timing.
- **Budgets are reserved when a call starts and settled when it ends** (``Ticket``): concurrent
  calls cannot each spend what is left. An episode counts the ids its calls sampled (every
  choice, every segment) and the ids inserted between a continued choice and its continuation
  (tool results, user turns); a call that fails or is aborted gives its reservation back.
- **Memory is bounded**: the ids an episode records (prompts and completions) and its calls are
  capped; the KV caches kept to continue from are bounded in bytes (``kv_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rollwise.engine.engine import Completion
from rollwise.serve.driver import Job


@dataclass
class Choice:
    """One sampled assistant turn of a recorded call."""

    prompt_ids: list[int]  # this call's whole prompt
    ids: list[int]  # the ids it sampled
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    key: tuple = ()  # the assistant message returned (Message.key)
    ended: bool = False  # ended with an end-of-turn id: the conversation can go on after it token-faithfully
    start: int = 0  # length of the first prompt of the chain this call continues
    completion: Completion | None = field(default=None, repr=False)  # kept for the continuation's cache


@dataclass
class Call:
    keys: list[tuple]  # the request's messages (Message.key)
    choices: list[Choice]
    messages: list[dict] = field(default_factory=list)  # the request's messages (as the chat template reads them)
    index: int = 0  # the call's index in its episode (taken when it started; seeds its choices)


@dataclass
class Ticket:
    """What one call reserved of its episode's budgets when it started."""

    index: int  # the call's index
    tokens: int = 0  # budget tokens: inserted ids + n × the call's max_tokens
    segments: int = 0  # chains the call starts
    recorded: int = 0  # ids it may record: n × (prompt + max_tokens)
    settled: bool = False


@dataclass
class EpisodeLog:
    key: tuple[int, ...]  # call k's choice 0 samples with seed derive(*key, k) (an in-process episode's turn k's)
    calls: list[Call] = field(default_factory=list)  # in index order
    jobs: list[Job] = field(default_factory=list)
    run: bool = False  # opened by a training run (ChatService.open): its key seeds every call, whatever is asked
    started: int = 0  # calls started: the next call's index
    tokens: int = 0  # budget tokens of recorded calls and those in flight (reserved)
    segments: int = 0  # chains started by recorded calls and those in flight
    recorded: int = 0  # ids recorded (prompts and completions) and reserved
    kv: int = 0  # bytes of the keys/values kept to continue from (its latest recorded call's)

    def reserve(self, ticket: Ticket) -> None:
        self.tokens += ticket.tokens
        self.segments += ticket.segments
        self.recorded += ticket.recorded

    def release(self, ticket: Ticket) -> None:
        """Give back what a call that recorded nothing reserved (once)."""
        if not ticket.settled:
            ticket.settled = True
            self.tokens -= ticket.tokens
            self.segments -= ticket.segments
            self.recorded -= ticket.recorded

    def add(self, call: Call, ticket: Ticket, inserted: int) -> None:
        """Record a finished call in index order, its reservation replaced by what it used."""
        self.release(ticket)
        self.tokens += inserted + sum(len(c.ids) for c in call.choices)
        self.segments += ticket.segments
        self.recorded += sum(len(c.prompt_ids) + len(c.ids) for c in call.choices)
        at = len(self.calls)
        while at and self.calls[at - 1].index > call.index:
            at -= 1
        self.calls.insert(at, call)


def kv_bytes(call: Call) -> int:
    """Bytes of the keys/values a call's choices keep to continue from (measured from the tensors)."""
    return sum(t.numel() * t.element_size() for c in call.choices
               if c.completion is not None and c.completion.kv is not None for t in c.completion.kv)


def drop_kv(call: Call) -> None:
    """Forget a call's kept keys/values (a later call is prefilled whole instead)."""
    for c in call.choices:
        if c.completion is not None and c.completion.kv is not None:
            c.completion = replace(c.completion, kv=None)
