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
  capped; the KV caches kept to continue from are bounded in bytes (``kv_bytes``); a server keeps
  a bounded number of the tags it opened itself and of the ids they record (``Episodes``).
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from rollwise.engine.engine import Completion
from rollwise.serve.driver import Job
from rollwise.serve.schema import ApiError

TAGGED = 1  # seed-derivation key of a server's own tags (an int: derive hashes)
MB = 1 << 20


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
    run: bool = False  # opened by a training run (Episodes.open): its key seeds every call, whatever is asked
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


class Episodes(Mapping[str, EpisodeLog]):
    """The tags one server records, least recently used first, and the memory they may keep.

    A training run opens and closes its own tags (``open``, ``close``) from its thread while the
    server's loop reads them and forgets its own (hence ``lock``); a run's tags are closed by the
    run, never forgotten here. Caps: ``max_episodes`` tags and ``max_recorded_tokens`` recorded ids
    of the tags the server opened itself; kept caches within ``kv_cache_mb`` and ``max_cached``
    episodes. ``open_tags_only``: a tag no run opened is refused (a training run's endpoint).
    """

    def __init__(self, seed: int, *, max_episodes: int = 4096, max_cached: int = 256, kv_cache_mb: float = 1024.0,
                 max_recorded_tokens: int = 1 << 23, open_tags_only: bool = False):
        self.seed, self.max_episodes, self.max_recorded_tokens = seed, max_episodes, max_recorded_tokens
        # a SmolLM2 episode of 500 tokens holds ~23 MB of keys/values; a dropped cache is prefilled whole next call
        self.max_cached, self.kv_cache_mb, self.open_tags_only = max_cached, kv_cache_mb, open_tags_only
        self._logs: OrderedDict[str, EpisodeLog] = OrderedDict()
        self.lock = threading.RLock()

    def __getitem__(self, tag: str) -> EpisodeLog:
        return self._logs[tag]

    def __iter__(self):
        return iter(self._logs)

    def __len__(self) -> int:
        return len(self._logs)

    def open(self, tag: str, key: tuple[int, ...]) -> None:
        """Open a training run's episode: call k samples with ``derive(*key, k)`` whatever seed it asks."""
        with self.lock:
            self._logs[tag] = EpisodeLog(tuple(key), run=True)

    def close(self, tag: str) -> EpisodeLog | None:
        """Forget an episode (its unfinished requests are aborted); return its record."""
        with self.lock:
            self.cancel(tag, "the episode was closed")
            return self._logs.pop(tag, None)

    def cancel(self, tag: str, why: str = "the episode's requests were cancelled") -> None:
        """Abort an episode's unfinished requests (at the engine's next step); keep its record."""
        log = self._logs.get(tag)
        for job in list(log.jobs) if log else []:
            job.cancel(why)

    def touch(self, tag: str) -> EpisodeLog:
        """The tag's record, most recently used now; a tag first seen is opened with the server's seed."""
        with self.lock:
            if tag not in self._logs:
                if self.open_tags_only:
                    raise ApiError(404, f"episode '{tag}' is not open: this endpoint serves a training run and "
                                   "records only the episodes the run opened (use the base URL the run gave you)",
                                   "tag", "episode_not_found")
                self._logs[tag] = EpisodeLog((self.seed, TAGGED, zlib.crc32(tag.encode())))
                self._forget_oldest(lambda: len(self._logs) > self.max_episodes, keep=tag)
            self._logs.move_to_end(tag)
            return self._logs[tag]

    def bound(self, log: EpisodeLog) -> None:
        """After ``log`` recorded a call: kept caches within ``kv_cache_mb`` and ``max_cached``,
        recorded ids within ``max_recorded_tokens`` (least recently used dropped first; ``log``'s
        tag is kept)."""
        with self.lock:
            keep = next((t for t, lg in reversed(self._logs.items()) if lg is log), "")
            cached = [lg for lg in self._logs.values() if lg.kv]
            total = sum(lg.kv for lg in cached)
            for n, old in enumerate(cached):
                if total <= self.kv_cache_mb * MB and len(cached) - n <= self.max_cached:
                    break
                for call in old.calls:
                    drop_kv(call)
                total, old.kv = total - old.kv, 0
            self._forget_oldest(lambda: sum(lg.recorded for lg in self._logs.values() if not lg.run)
                                > self.max_recorded_tokens, keep=keep)

    def _forget_oldest(self, too_many, keep: str) -> None:
        """Forget tags this server opened itself, least recently used first, while ``too_many()``
        (a call in flight on a forgotten tag still answers, unrecorded)."""
        for tag in [t for t, lg in self._logs.items() if not lg.run and t != keep]:
            if not too_many():
                return
            del self._logs[tag]
