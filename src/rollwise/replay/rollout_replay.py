"""``rollout_replay``: Rollout Replay — "Improving Data Efficiency for LLM Reinforcement
Fine-tuning Through Difficulty-targeted Online Data Selection and Rollout Replay" (Sun et al.,
2025; METHODS.md: Rollout Replay, with ``difficulty_select``).

Recent rollouts are reused, experience-replay style, to cut per-step generation. A FIFO keeps
groups with their behaviour log-probs and per-token versions. A step that trains on ``n``
groups generates ``n - ⌊share·n⌋`` fresh ones (``fresh_prompts``) and takes the other
``⌊share·n⌋`` from the buffer, never older than ``max_age`` versions (``compose``); its fresh
groups then join the buffer, so a step never replays its own groups. The stored behaviour
log-probs reach the loss as ``behavior_logprobs``: the loop's off-policy correction
(``objective.tis_mode``) weights the replayed tokens by the proximal/behaviour ratio.
``share: 0`` is on-policy training: ``compose`` returns the fresh list itself.

Departures from the paper:
- The unit is the group, not the rollout: a replayed group keeps the advantages computed
  within it when it was fresh (nothing is recomputed under the newer policy).
- The off-policy correction is the loop's decoupled form (ratio against the proximal policy,
  truncated proximal/behaviour IS weight, ``tis_mode``), not a single clipped π_θ/μ ratio.
- Groups whose advantages are all 0 are not stored (``skip_zero_signal``): replaying them
  would spend half the batch on rows with no gradient.
- While the buffer holds fewer young-enough groups than the share asks (the first steps),
  the step generates the difference fresh, so the batch keeps its size.
- Sampling is uniform without replacement within a step and does not remove: a group can be
  served again at a later step while it is young enough.
"""

from __future__ import annotations

import math

from pydantic import Field

from rollwise import seeds
from rollwise.config import StrictModel
from rollwise.replay.base import Replay, age_metrics, mean_length
from rollwise.replay.buffer import ReplayBuffer
from rollwise.types import RolloutGroup


class RolloutReplayConfig(StrictModel):
    share: float = Field(0.5, ge=0, lt=1, description="share of each step's groups served from the buffer "
                         "(0 = on-policy)")
    max_age: int = Field(2, ge=0, description="serve only groups at most this many policy versions old")
    capacity: int = Field(256, ge=1, description="buffer size in groups (FIFO eviction)")
    skip_zero_signal: bool = Field(True, description="do not store groups whose advantages are all 0 "
                                   "(they train nothing)")


def has_signal(group: RolloutGroup) -> bool:
    """Some trained token of the group has a non-zero advantage (false for every group with no
    signal, ``rollwise.types.is_zero_signal``: the estimators give those exactly 0)."""
    for r in group.rollouts:
        weights = r.loss_weights or [1] * len(r.advantage or [])
        if any(a != 0 and w for a, w in zip(r.advantage or [], weights)):
            return True
    return False


class RolloutReplay(Replay):
    name = "rollout_replay"

    def __init__(self, cfg: RolloutReplayConfig, **kw) -> None:
        super().__init__(**kw)
        self.share, self.skip_zero_signal = cfg.share, cfg.skip_zero_signal
        self.buffer = ReplayBuffer(cfg.capacity, cfg.max_age)
        self.planned: dict[int, int] = {}  # step -> groups it serves, fixed by fresh_prompts
        self.last: tuple[int, int] | None = None  # (step, version) of the last compose

    def replaying(self, step: int) -> bool:
        """Whether step ``step`` serves from the buffer and feeds it (ReMix: until reincarnation)."""
        return self.share > 0

    def fresh_prompts(self, n: int, step: int) -> int:
        if not self.replaying(step):
            return n
        serve = min(math.floor(self.share * n + 1e-9), self.buffer.servable(self.expected_version(step)))
        self.planned[step] = serve
        return n - serve

    def expected_version(self, step: int) -> int:
        """The policy version step ``step`` will update: one version per step after the last compose
        (if it turns out newer, some planned groups have aged out and the step serves fewer)."""
        if self.last is None:
            return step
        last_step, last_version = self.last
        return last_version + max(step - last_step, 0)

    def compose(self, fresh: list[RolloutGroup], *, step: int, version: int
                ) -> tuple[list[RolloutGroup], dict[str, float]]:
        if not self.replaying(step):
            return fresh, {}
        want = self.planned.pop(step, None)
        if want is None:  # fresh_prompts was not asked for this step: serve the share of the whole batch
            want = round(len(fresh) * self.share / (1 - self.share))
        served = self.buffer.sample(want, self.rng(step, seeds.REPLAY_SAMPLE), version)
        self.buffer.add([g for g in fresh if has_signal(g) or not self.skip_zero_signal], version)
        self.last = (step, version)
        self.planned = {s: k for s, k in self.planned.items() if s > step}  # plans of steps that never came
        return fresh + served, self.metrics(fresh, served, version)

    def metrics(self, fresh: list[RolloutGroup], served: list[RolloutGroup], version: int) -> dict[str, float]:
        total = max(len(fresh) + len(served), 1)
        return {"replay/fresh_groups": float(len(fresh)), "replay/served_groups": float(len(served)),
                "replay/share": len(served) / total, "replay/buffer_groups": float(len(self.buffer)),
                "replay/evicted_groups": float(self.buffer.evicted),
                "replay/expired_groups": float(self.buffer.expired),
                "replay/length_fresh": mean_length(fresh), "replay/length_served": mean_length(served),
                } | age_metrics(served, version)

    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict(), "planned": dict(self.planned), "last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.planned = dict(state["planned"])
        self.last = None if state["last"] is None else tuple(state["last"])
