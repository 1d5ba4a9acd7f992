"""Records of engine v2 (``slots.SlotEngine``): a sequence's host-side state, fork families,
paused states (and ``continuation``, the state that continues a finished one), stats, and how
fork children are seeded."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from rollwise.engine.engine import Completion, EngineStats
from rollwise.engine.sampling import SamplingParams

_MASK64 = (1 << 64) - 1


def child_seed(seed: int, index: int) -> int:
    """Seed of fork child ``index`` of a sequence seeded ``seed`` (splitmix64 of the pair, < 2**63)."""
    x = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


@dataclass
class PartialState:
    """A paused sequence: what ``resume`` needs to continue it as if it had never stopped; or a
    finished one with ids appended (``continuation``)."""

    prompt_ids: list[int]
    token_ids: list[int]  # completion so far
    logprobs: list[float]  # behaviour log-prob of each completion token (0.0 where forced)
    versions: list[int]  # policy version that sampled each completion token
    params: SamplingParams
    seed: int
    generator_state: torch.Tensor | None  # torch.Generator.get_state(); None: a new generator seeded ``seed``
    forced: list[int] = field(default_factory=list)  # positions placed (fork(replace_last=...), inserted ids)
    # pause(keep_cache=True) or Completion.kv: cached keys/values (one [2, n_kv_heads, L, head_dim]
    # tensor per layer, positions [0, L) of the ids) and the oldest policy version among them;
    # resume reuses them instead of recomputing (never checkpointed)
    kv: list[torch.Tensor] | None = field(default=None, repr=False)
    kv_version: int | None = None


def continuation(done: Completion, appended_ids: list[int], *, params: SamplingParams, seed: int,
                 version: int) -> PartialState:
    """The state that continues the finished ``done`` after the caller appended ``appended_ids``
    (a tool result, the next user turn): ``SlotEngine.resume`` samples on from there.

    The appended ids join ``token_ids`` as forced tokens (log-prob 0.0, version ``version``: pass
    the engine's), so ``Completion.forced`` lists them and they take no loss. ``params`` applies
    to the whole completion: ``max_new_tokens`` counts every token so far, sampled or appended.
    With ``done.kv`` (``keep_cache``) only the last sampled id and ``appended_ids`` are
    prefilled; without it, or after a weight update, the whole conversation is. Either way it
    samples as a fresh request seeded ``seed`` whose prompt is the whole conversation would.
    (With no ``appended_ids`` the cache covers all but the last id and is reused as
    ``pause(keep_cache=True)``'s is, even after a weight update.)
    E.g. ``engine.resume([continuation(done, tool_ids, params=p, seed=s + 1, version=engine.version)])``.
    """
    start, appended = len(done.token_ids), list(appended_ids)
    return PartialState(
        prompt_ids=list(done.prompt_ids), token_ids=done.token_ids + appended,
        logprobs=done.logprobs + [0.0] * len(appended), versions=done.versions + [version] * len(appended),
        params=params, seed=seed, generator_state=None,
        forced=done.forced + list(range(start, start + len(appended))), kv=done.kv, kv_version=done.kv_version,
    )


@dataclass
class SlotEngineStats(EngineStats):
    """v1's counters (``prefill_tokens`` counts every token run through a prefill, re-prefills
    included; ``padded_decode_slots`` counts sampled rows, so ``occupancy`` is 1 by construction)
    plus what v2 adds."""

    prefix_tokens_shared: int = 0  # cached positions copied between slots by fork instead of computed
    reprefill_tokens: int = 0  # of prefill_tokens: prefixes computed again (resume; fork with no sibling left)
    restored_tokens: int = 0  # cached positions resume copied back from pause(keep_cache=True) instead of computing
    prefix_cache_hits: int = 0  # fresh sequences admitted with a kept prompt prefix (keep_prefixes)
    prefix_cache_tokens: int = 0  # prompt positions those hits copied in instead of prefilling
    row_sorts: int = 0  # times the running rows were reordered by length (decode attention buckets)
    aborted: int = 0  # sequences ended by abort() (online pruning): no completion, tokens dropped
    aborted_tokens: int = 0  # tokens those sequences had sampled (in decode_tokens, in no completion)
    steps: int = 0  # step() calls that ran the model
    slots: int = 0  # max concurrent sequences
    # occupancy over time: sequences sampled at each step (the most recent 100k steps)
    rows_per_step: deque = field(default_factory=lambda: deque(maxlen=100_000))

    @property
    def slot_occupancy(self) -> float:
        """Mean share of the slots that sampled a token per step."""
        return self.decode_tokens / (self.steps * self.slots) if self.steps else 0.0

    def as_dict(self) -> dict[str, float]:
        d = super().as_dict()
        d.update(prefix_tokens_shared=self.prefix_tokens_shared, reprefill_tokens=self.reprefill_tokens,
                 restored_tokens=self.restored_tokens, prefix_cache_hits=self.prefix_cache_hits,
                 prefix_cache_tokens=self.prefix_cache_tokens, aborted=self.aborted, aborted_tokens=self.aborted_tokens,
                 steps=self.steps, slot_occupancy=self.slot_occupancy)
        return d


@dataclass(eq=False)
class ForkFamily:
    """The children of one fork. Every member's first ``shared_len`` cached positions are the
    shared prefix, so any running member can seed a newly admitted one."""

    shared_len: int
    members: list[Sequence] = field(default_factory=list)
    same_ids: bool = True  # False when fork replaced some children's last token

    def running(self) -> Sequence | None:
        return next((m for m in self.members if m.row is not None), None)


@dataclass(frozen=True)
class SequenceView:
    """What ``SlotEngine.peek`` shows of a live sequence. The lists are the engine's own: read only."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    candidates: list[tuple[int, float]] | None  # (id, logprob) best first, if params.top_candidates
    hidden: torch.Tensor | None = None  # [D] final hidden state behind the latest token, if params.keep_hidden


@dataclass(eq=False)
class Sequence:
    """One queued or running sequence as the engine tracks it on the host (engine-internal)."""

    handle: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)  # positions of tokens placed (fork, a continuation), not sampled
    candidates: list[tuple[int, float]] | None = None  # top tokens (id, logprob) of the latest position
    hidden: torch.Tensor | None = None  # [D] final hidden state behind the latest token (params.keep_hidden)
    family: ForkFamily | None = None
    recompute: bool = False  # its ids were computed before (resumed, or a running parent's child)
    parked: list[torch.Tensor] | None = None  # resumed with its cache: copied in on admission, not computed
    cache_version: int | None = None  # oldest policy version among its cached keys/values (parked or in its row)
    row: int | None = None  # cache row while running

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.tokens
