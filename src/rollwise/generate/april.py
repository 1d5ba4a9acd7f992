"""``april``: active partial rollouts — APRIL ("APRIL: Active Partial Rollouts in Reinforcement
Learning to Tame Long-tail Generation", 2025).

A step submits ``over_provision`` × ``prompts_per_step`` groups instead of
``prompts_per_step``. As soon as ``prompts_per_step`` groups are complete (every one of a
group's rollouts finished), the step's rollouts are returned and every unfinished rollout
is paused (``engine.pause``): its ids, behaviour log-probs, per-token versions and sampler
state go into the carry-over buffer, with the finished rollouts of its group. The next
step resumes the buffer first (under the new weights) and fills up with fresh prompts.

Nothing is discarded: ``started = trained + carried`` holds at every step boundary (the
counters are in the step metrics and the checkpoint), and the buffer is saved with every
checkpoint, so a resumed run continues the carried rollouts as the uninterrupted one would.
Resumed tokens come from older policy versions (``Rollout.versions``): the objective's
``tis_mode`` (``tis_mis``) reweights them; ``token_truncate`` is the recommended mode.

``reuse_kv`` (off by default) keeps each paused rollout's cached keys/values with it
(``SlotEngine.pause(keep_cache=True)``), so resuming costs a copy instead of a prefill of
prompt + partial completion. The prefix's keys/values are then the old policy's — the
in-flight weight update of PipelineRL ("PipelineRL: Faster On-policy Reinforcement Learning
for Long Sequence Generation", Piché et al., 2025). On a GPU a prefill is cheap next to
decoding; on a CPU it costs about as much as decoding the same tokens, which is what this
option is for. A checkpoint drops the carried caches (they are never saved), in the
uninterrupted run as well, so a resumed run still continues exactly as the uninterrupted one.

Departures from the paper: a group counts as complete only when all its rollouts are
(APRIL counts responses); when several groups complete in the same engine step, all of
them are returned (a step may train on slightly more than ``prompts_per_step`` groups).
``max_partial_age`` (METHODS.md) belongs to ``staleness_async`` and is not implemented here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import torch
from pydantic import Field

from rollwise.config import ConfigError
from rollwise.config import StrictModel
from rollwise.engine.engine import Request
from rollwise.engine.protocol import BranchingEngine
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import PartialState
from rollwise.generate.base import Generator
from rollwise.generate.group import to_rollout
from rollwise.seeds import derive
from rollwise.types import Prompt, Rollout, RolloutGroup


class AprilConfig(StrictModel):
    over_provision: float = Field(1.5, ge=1, description="groups in flight per step / prompts_per_step (APRIL's B'/B)")
    reuse_kv: bool = Field(False, description="carry paused rollouts' KV cache instead of recomputing it under the "
                           "new weights (in-flight update, PipelineRL-style; cheaper where prefill is not)")


@dataclass
class _Flight:
    """One group in flight: its prompt, finished rollouts, and handles still running."""

    prompt: Prompt
    size: int
    done: list[Rollout] = field(default_factory=list)
    partial: list[PartialState] = field(default_factory=list)  # in the buffer only

    @property
    def complete(self) -> bool:
        return len(self.done) == self.size


@dataclass
class AprilSampler(Generator):
    params: SamplingParams
    decode: object
    cfg: AprilConfig
    target: int  # prompts_per_step: complete groups a step needs

    def __post_init__(self) -> None:
        self.buffer: list[_Flight] = []
        self.started = 0  # rollouts ever submitted
        self.trained = 0  # rollouts ever returned in complete groups

    @property
    def carried(self) -> int:
        return sum(f.size for f in self.buffer)

    def prompts_wanted(self, n: int) -> int:
        """Fresh prompts to add this step: fill ``over_provision · n`` groups after the carried ones."""
        return max(math.ceil(self.cfg.over_provision * n) - len(self.buffer), 0)

    def generate(self, engine: BranchingEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        if not hasattr(engine, "pause"):
            raise ConfigError("rollout.strategy=april needs the slot engine (pause/resume); set rollout.engine=slots "
                             "(Llama/Qwen2/Mistral models) or use rollout.strategy=group")
        flights, owner = [], {}
        resumed_tokens = 0
        for flight in self.buffer:  # carried groups first, under the new weights
            handles = engine.resume(flight.partial)
            resumed_tokens += sum(len(p.token_ids) for p in flight.partial)
            owner.update({h: len(flights) for h in handles})
            flight.partial = []
            flights.append(flight)
        self.buffer = []
        for pi, (prompt, n) in enumerate(zip(prompts, budgets)):
            requests = [Request(prompt.token_ids, replace(self.params, seed=derive(seed, pi, j)))
                        for j in range(n)]
            owner.update({h: len(flights) for h in engine.submit(requests)})
            flights.append(_Flight(prompt, n))
            self.started += n
        complete: list[int] = [i for i, f in enumerate(flights) if f.complete]
        while owner and len(complete) < self.target:
            for c in engine.step():
                fi = owner.pop(c.handle)
                flights[fi].done.append(to_rollout(flights[fi].prompt, c, self.decode))
                if flights[fi].complete:
                    complete.append(fi)
        self._carry(engine, flights, owner, set(complete))
        groups = [RolloutGroup(prompt=flights[i].prompt, rollouts=flights[i].done) for i in complete]
        returned = sum(len(g.rollouts) for g in groups)
        self.trained += returned
        versions = [v for g in groups for r in g.rollouts for v in r.versions]
        metrics = {
            "april/groups_returned": float(len(groups)), "april/carried_groups": float(len(self.buffer)),
            "april/carried_rollouts": float(self.carried), "april/started": float(self.started),
            "april/trained": float(self.trained), "april/resumed_tokens": float(resumed_tokens),
            "april/token_age_max": float(max(versions) - min(versions)) if versions else 0.0,
        }
        assert self.started == self.trained + self.carried, "APRIL lost a rollout"
        return groups, metrics

    def _carry(self, engine, flights: list[_Flight], owner: dict[int, int], complete: set[int]) -> None:
        """Pause what still runs and keep every incomplete group (finished rollouts + partial states)."""
        handles = list(owner)
        for h, state in zip(handles, engine.pause(handles, keep_cache=self.cfg.reuse_kv)):
            flights[owner[h]].partial.append(state)
        self.buffer = [f for i, f in enumerate(flights) if i not in complete]

    # -- checkpointed with the run ---------------------------------------------------------
    def state_dict(self) -> dict:
        for flight in self.buffer:  # carried caches are not saved: drop them here too, so the
            for p in flight.partial:  # uninterrupted run recomputes exactly as a resumed one will
                p.kv = p.kv_version = None
        return {
            "started": self.started, "trained": self.trained,
            "buffer": [{"prompt": asdict(f.prompt), "size": f.size, "done": [asdict(r) for r in f.done],
                        "partial": [_state_to_dict(p) for p in f.partial]} for f in self.buffer],
        }

    def load_state_dict(self, state: dict) -> None:
        self.started, self.trained = state["started"], state["trained"]
        self.buffer = [_Flight(Prompt(**f["prompt"]), f["size"], [Rollout(**r) for r in f["done"]],
                               [_state_from_dict(p) for p in f["partial"]]) for f in state["buffer"]]


def _state_to_dict(p: PartialState) -> dict:
    d = {k: v for k, v in asdict(p).items() if k not in ("kv", "kv_version")}
    d["params"] = {**asdict(p.params), "stop_token_ids": list(p.params.stop_token_ids)}
    return d


def _state_from_dict(d: dict) -> PartialState:
    params = SamplingParams(**{**d["params"], "stop_token_ids": tuple(d["params"]["stop_token_ids"])})
    return PartialState(**{**d, "params": params, "generator_state": torch.as_tensor(d["generator_state"])})

