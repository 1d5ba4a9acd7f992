"""``dynamic_sampling``: DAPO's dynamic sampling — "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale" (Yu et al., 2025), §3.2.

A group whose rewards are all equal gets zero advantage and no gradient. The controller
drops such groups after scoring (``accept``) and the loop refills the batch with fresh
prompts until it holds ``prompts_per_step`` informative groups or ``max_rounds`` refill rounds
have run. The refill cost is logged: ``control/refill_rounds``, ``control/refill_tokens``
(tokens the engine sampled for refills), ``control/dropped_groups``, ``control/cap_hit``.

Departures from the paper:
- Informative means population std(rewards) > ``tolerance`` (1e-6), not "not all equal":
  rewards that differ by rounding count as equal.
- Refilling is capped (3 rounds by default; DAPO samples until the batch is full). When the
  cap is hit the step trains on the informative groups it has (fewer than the batch size).
- Each refill round asks for exactly the missing number of prompts (DAPO over-samples a
  whole generation batch).
- No padding of the batch to a multiple of the world size: training runs in one process.
"""

from __future__ import annotations

import math

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller
from rollwise.types import RolloutGroup


class DynamicSamplingConfig(StrictModel):
    tolerance: float = Field(1e-6, ge=0, description="a group is informative if the std of its rewards exceeds this")
    max_rounds: int = Field(3, ge=0, le=8, description="refill rounds per step at most (the cap)")


def informative(rewards: list[float], tolerance: float = 1e-6) -> bool:
    """Whether a group's rewards spread by more than ``tolerance`` (population std).

    >>> informative([0.0, 1.0, 0.0]), informative([1.0, 1.0, 1.0]), informative([0.3, 0.3 + 1e-9])
    (True, False, False)
    """
    if len(rewards) < 2:
        return False
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) > tolerance


class DynamicSampling(Controller):
    name = "dynamic_sampling"
    refills = True

    def __init__(self, cfg: DynamicSamplingConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.max_rounds = cfg.max_rounds

    def accept(self, group: RolloutGroup) -> bool:
        return informative(group.rewards, self.cfg.tolerance)
