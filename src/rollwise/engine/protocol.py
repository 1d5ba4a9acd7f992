"""The engine contract (DESIGN.md "Engine"), written down once.

Everything the trainer loop and the rollout strategies (``generate/``) call on an engine is a
member of one of these Protocols, so a new backend (vLLM, llama.cpp, a remote server) has one
list to implement. Each tier adds to the one before:

- ``PolicySampler``: what the loop reads of whatever samples for it. ``version`` is the policy
  version every sampled token is tagged with (the loop sets it after a checkpoint load);
  ``load_weights(source)`` takes the updated policy (a model or a state dict) and returns the
  new version; ``stats.decode_tokens`` counts the tokens sampled so far (the run's token
  budget). ``Engine``, ``SlotEngine`` and ``dist.WorkerPool`` keep it (the pool runs the
  strategy on its Ray workers itself: ``dist.pool.RolloutPool``).
- ``TokenEngine``: samples token ids. ``submit(requests) -> handles`` queues requests,
  ``step()`` gives every running sequence one token and returns the ones that finished,
  ``run_until(condition)`` steps until ``condition(finished)`` holds (default: nothing left)
  and hands back what finished, ``generate(requests)`` runs them to completion in order.
  Every token comes with its log-probability under the sampling distribution actually used
  and the policy version that sampled it (``Completion``); a request's tokens depend on its
  ``SamplingParams.seed`` only, never on its batch-mates. ``device`` is where the weights live
  (the trainer puts its reference model there). Enough for ``rollout.strategy=group`` and for
  evaluation; the v1 ``Engine`` keeps it.
- ``BranchingEngine``: also works on live sequences. ``peek(handle)`` shows one's tokens so
  far, ``fork(handle, n)`` replaces it by ``n`` children sharing its prefix (each seeded
  ``state.child_seed(seed, i)``), ``pause(handles)`` stops them and returns ``PartialState``
  records that ``resume(states)`` continues exactly (or a finished ``keep_cache`` sequence with
  ids appended, ``state.continuation``: only those are prefilled), ``abort(handles)`` ends them for good,
  ``keep_prefixes(n)`` keeps the last ``n`` prompts' cached prefixes for later requests.
  Tree, LATR and APRIL rollouts, ARRoL's pruning and ``should_continue`` gates need it (each
  checks for the member it calls and names the engine it needs); ``SlotEngine`` keeps it.

Stats a branching engine also counts (``SlotEngineStats``): ``prefix_cache_tokens`` (read by
the loop when a controller extends groups) and ``aborted_tokens``.

``contract_gaps(cls, protocol)`` lists where a class departs from a tier's methods (a missing
one, or parameters that differ in name, kind or default); ``isinstance(engine, protocol)``
checks an instance's data members too. A backend's test asserts both (tests/test_engine_protocol.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from rollwise.engine.engine import Completion, EngineStats, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import PartialState, SequenceView


class SampledTokens(Protocol):
    decode_tokens: int  # tokens sampled so far (kept in completions or, for a branching engine, aborted)


@runtime_checkable
class PolicySampler(Protocol):
    """What the trainer loop reads of whatever samples for it (an engine or ``dist.WorkerPool``)."""

    version: int  # the policy version tokens sampled from now on are tagged with
    stats: SampledTokens

    def load_weights(self, source) -> int:
        """Take the updated policy (a model whose parameters may be shared, or a state dict); return
        the new version."""
        ...


@runtime_checkable
class TokenEngine(PolicySampler, Protocol):
    """Batched sampling of token ids with per-token behaviour log-probs (the v1 ``Engine``)."""

    stats: EngineStats
    device: torch.device

    def submit(self, requests: list[Request]) -> list[int]:
        """Queue ``requests``; return one handle each."""
        ...

    def step(self) -> list[Completion]:
        """One token for every running sequence (admitting queued ones); return those that finished."""
        ...

    def run_until(self, condition: Callable[[dict[int, Completion]], bool] | None = None) -> dict[int, Completion]:
        """Step until ``condition(finished)`` holds (None: until nothing is left); return and clear what finished."""
        ...

    def generate(self, requests: list[Request]) -> list[Completion]:
        """Submit ``requests``, run them to completion, return their completions in request order."""
        ...


@runtime_checkable
class BranchingEngine(TokenEngine, Protocol):
    """A token engine that also peeks at, forks, pauses, resumes and aborts live sequences (``SlotEngine``)."""

    def peek(self, handle: int) -> SequenceView:
        """The tokens so far of a queued or running sequence (the engine's own lists: read only)."""
        ...

    def fork(self, handle: int, n: int, params: list[SamplingParams] | None = None,
             replace_last: list[int | None] | None = None) -> list[int]:
        """Replace a live sequence by ``n`` children sharing its prefix; return their handles."""
        ...

    def pause(self, handles: list[int], keep_cache: bool = False) -> list[PartialState]:
        """Stop these sequences, free their slots, return what ``resume`` needs to continue them."""
        ...

    def resume(self, states: list[PartialState]) -> list[int]:
        """Queue paused sequences to continue exactly where they stopped (or finished ones with ids
        appended, ``state.continuation``); return new handles."""
        ...

    def abort(self, handles: list[int]) -> None:
        """End these sequences for good: no completion, nothing to resume."""
        ...

    def keep_prefixes(self, n: int) -> None:
        """Keep the cached prefixes of the last ``n`` prompts prefilled (0: none) until the weights change."""
        ...


def protocol_methods(protocol: type) -> dict[str, Callable]:
    """The methods a Protocol declares, its bases' included (name -> the declared function)."""
    out: dict[str, Callable] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object, Protocol) or not getattr(klass, "_is_protocol", False):
            continue
        out |= {name: f for name, f in vars(klass).items() if inspect.isfunction(f) and not name.startswith("_")}
    return out


def contract_gaps(cls: type, protocol: type) -> list[str]:
    """Where ``cls``'s methods depart from ``protocol``'s: missing ones, and parameters that differ
    in name, kind or default (annotations aside). Empty when ``cls`` keeps the contract."""
    gaps = []
    for name, declared in protocol_methods(protocol).items():
        impl = getattr(cls, name, None)
        if not callable(impl):
            gaps.append(f"{cls.__name__}.{name}: missing")
            continue
        want, have = _parameters(declared), _parameters(impl)
        if want != have:
            gaps.append(f"{cls.__name__}.{name}{have} != {protocol.__name__}.{name}{want}")
    return gaps


def _parameters(f: Callable) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(f).parameters.values()]
