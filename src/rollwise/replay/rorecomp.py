"""``rorecomp``: RoRecomp — "RoRecomp: Enhancing Reasoning Efficiency via Rollout Response
Recomposition in Reinforcement Learning" (Li et al., 2025; METHODS.md: RoRecomp).

The responses of each fresh group are split after advantages are computed within the
original group (the loop's ``assign_advantages`` runs before ``compose``):

- the *priority* set — correct responses at or below the group's median correct length and
  incorrect ones at or above its median incorrect length (``priority_mask``) — is trained at
  once: a clear brevity gradient (short correct pushed up, long incorrect pushed down);
- the rest (long correct, short incorrect) goes to the buffer, and every
  ``compensation_every``-th step (steps k−1, 2k−1, … counting from 0) the buffer is drained
  into a *compensation* batch for stability.

Each response lands in exactly one place: this step's priority batch or the buffer, and from
the buffer in exactly one compensation batch (or nowhere, if it ages past ``max_age`` or is
evicted at ``capacity`` — both counted in the metrics, neither happens with the defaults in
synchronous training).

Our reading of "compensation batches": the compensation batch is trained *in addition to*
that step's priority batch, in the same update, and it drains the whole buffer as it stood
before the step (this step's remainder waits for the next compensation). So every response is
trained exactly once, only later when it is not a priority response: the method reorders
gradient signal over time and never discards it, which is what keeps it stable. Training the
compensation batch *instead of* the priority batch would have to defer or drop that step's
priority responses, and the brevity signal is the point of the method.

Departures from the paper:
- The compensation batch shares the step's optimizer update with the priority batch (the
  paper runs it as its own batch).
- Compensation runs on a fixed period (``compensation_every``, 4), not a schedule.
- Median of an even count is the mean of the two middle lengths (``statistics.median``).
- Tree groups are refused (a shared prefix is trained once in one leaf; splitting the leaves
  would lose or double it): use ``rollout.strategy=group``.
"""

from __future__ import annotations

import statistics

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.replay.base import Replay, age_metrics, mean_length
from rollwise.replay.buffer import ReplayBuffer
from rollwise.types import Rollout, RolloutGroup


class RorecompConfig(StrictModel):
    compensation_every: int = Field(4, ge=1, description="every k-th step also trains the compensation batch "
                                    "(the buffer, drained)")
    max_age: int = Field(8, ge=0, description="buffered responses older than this many policy versions are dropped")
    capacity: int = Field(1024, ge=1, description="buffer size in (partial) groups, FIFO eviction")


def priority_mask(rollouts: list[Rollout]) -> list[bool]:
    """Per rollout, whether it is in the priority set: correct and at most the median correct
    length, or incorrect and at least the median incorrect length (lengths in completion tokens).

    >>> from rollwise.types import Rollout
    >>> r = lambda n, score: Rollout("p", [1], [7] * n, [0.0] * n, [0] * n, "stop", score=score)
    >>> priority_mask([r(2, 1), r(4, 1), r(9, 1), r(3, 0), r(8, 0)])  # medians: correct 4, incorrect 5.5
    [True, True, False, False, True]
    """
    correct = [r.num_tokens for r in rollouts if r.correct]
    incorrect = [r.num_tokens for r in rollouts if not r.correct]
    median_correct = statistics.median(correct) if correct else 0
    median_incorrect = statistics.median(incorrect) if incorrect else 0
    return [r.num_tokens <= median_correct if r.correct else r.num_tokens >= median_incorrect for r in rollouts]


def split_group(group: RolloutGroup) -> tuple[RolloutGroup | None, RolloutGroup | None]:
    """(priority part, remainder) of one flat group, each a group of the same prompt (None if empty)."""
    if group.tree is not None:
        raise ValueError(f"replay.method=rorecomp cannot split tree group {group.prompt.id!r}; "
                         "use rollout.strategy=group")
    keep = priority_mask(group.rollouts)
    priority = [r for r, k in zip(group.rollouts, keep) if k]
    rest = [r for r, k in zip(group.rollouts, keep) if not k]
    return (RolloutGroup(group.prompt, priority) if priority else None,
            RolloutGroup(group.prompt, rest) if rest else None)


def count(groups: list[RolloutGroup]) -> int:
    return sum(len(g.rollouts) for g in groups)


class Rorecomp(Replay):
    name = "rorecomp"

    def __init__(self, cfg: RorecompConfig, **kw) -> None:
        super().__init__(**kw)
        self.every = cfg.compensation_every
        self.buffer = ReplayBuffer(cfg.capacity, cfg.max_age)

    def compensates(self, step: int) -> bool:
        return step % self.every == self.every - 1

    def compose(self, fresh: list[RolloutGroup], *, step: int, version: int
                ) -> tuple[list[RolloutGroup], dict[str, float]]:
        priority, rest = [], []
        for g in fresh:
            p, q = split_group(g)
            priority += [p] if p is not None else []
            rest += [q] if q is not None else []
        compensation = self.buffer.drain(version) if self.compensates(step) else []
        self.buffer.add(rest, version)
        return priority + compensation, {
            "replay/fresh_groups": float(len(fresh)), "replay/priority_responses": float(count(priority)),
            "replay/buffered_responses": float(count(rest)), "replay/served_groups": float(len(compensation)),
            "replay/served_responses": float(count(compensation)), "replay/buffer_groups": float(len(self.buffer)),
            "replay/evicted_groups": float(self.buffer.evicted), "replay/expired_groups": float(self.buffer.expired),
            "replay/length_fresh": mean_length(fresh), "replay/length_priority": mean_length(priority),
        } | age_metrics(compensation, version)

    def state_dict(self) -> dict:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
