"""``dars``: DARS / DARS-B — "Depth-Breadth Synergy in RLVR: Unlocking LLM Reasoning Gains
with Adaptive Exploration" (2025).

GRPO's cumulative advantage Σ|A| over a group is largest at pass rate .5 and small for hard
prompts (``cumulative_advantage``: with std-normalised binary rewards it is
2·sqrt(G(G−1)p(1−p))), so hard prompts contribute little. DARS (depth) gives them more
rollouts: after the first round, every prompt whose pass rate is ≤ ``hard_below`` (.5) gets
extra rounds of G rollouts until it has ≥ G/2 correct ones or ``max_factor`` × G (4G)
rollouts in total. These rollouts come on top of the step's budget (the refill cost is
``control/extend_tokens``).

DARS-B adds breadth (``breadth: true``): the update runs ``breadth_epochs`` (2) full-batch
optimizer steps over the step's batch instead of one (``optim.num_iterations``, whichever
is larger); make the batch large with ``rollout.prompts_per_step``.

Departures from the paper:
- Rounds are whole groups of G and capped at 3 extra rounds per step (4G in total).
- A hard prompt with no correct rollout at all still gets its extra rounds (the paper's
  schedule also targets zero-accuracy problems); they stop at the cap.
- Breadth does not change the batch size by itself.
"""

from __future__ import annotations

import math

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller
from rollwise.control.stats import PromptStats
from rollwise.types import RolloutGroup


class DarsConfig(StrictModel):
    hard_below: float = Field(0.5, ge=0, le=1, description="prompts with a first-round pass rate <= this get extra "
                              "rounds")
    max_factor: int = Field(4, ge=1, description="a prompt gets at most max_factor x num_generations rollouts")
    breadth: bool = Field(False, description="DARS-B: breadth_epochs full-batch optimizer steps per step")
    breadth_epochs: int = Field(2, ge=1, description="optimizer steps over the batch when breadth is on")


def cumulative_advantage(g: int, p: float) -> float:
    """Σ|A| of a group of ``g`` binary rewards with pass rate ``p``, advantages (r − mean)/std (Bessel):
    2·sqrt(G(G−1)p(1−p)).

    >>> round(cumulative_advantage(8, 0.5), 2), round(cumulative_advantage(8, 0.125), 2)
    (7.48, 4.95)
    """
    return 2 * math.sqrt(g * (g - 1) * p * (1 - p))


def dars_extra(counts: list[int], successes: list[int], g: int, hard_below: float, max_total: int) -> list[int]:
    """Extra rollouts per prompt for the next depth round: ``g`` (or what fits under ``max_total``) for a
    prompt that was hard in its first ``g`` rollouts and still has fewer than g/2 correct ones."""
    extra = []
    for n, s in zip(counts, successes):
        first_round_hard = n > 0 and (n > g or s / n <= hard_below)  # past round one it stays hard until done
        want = first_round_hard and s < g / 2 and n < max_total
        extra.append(min(g, max_total - n) if want else 0)
    return extra


class Dars(Controller):
    name = "dars"

    def __init__(self, cfg: DarsConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.max_rounds = cfg.max_factor - 1
        self.update_passes = cfg.breadth_epochs if cfg.breadth else 1

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        return dars_extra([len(g.rollouts) for g in groups], [g.num_correct for g in groups],
                          self.num_generations, self.cfg.hard_below, self.cfg.max_factor * self.num_generations)
