"""``dynamic_sampling``: DAPO's dynamic sampling — "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale" (Yu et al., 2025), §3.2.

A group whose rewards are all equal gets zero advantage and no gradient. The controller
drops such groups after scoring (``accept``) and the loop refills the batch with fresh
prompts until it holds ``prompts_per_step`` informative groups or ``max_rounds`` refill rounds
have run. The refill cost is logged: ``control/refill_rounds``, ``control/refill_tokens``
(tokens the engine sampled for refills), ``control/dropped_groups``, ``control/cap_hit``.

Departures from the paper:
- Informative means "not zero signal" in the one sense every stage uses
  (``rollwise.types.is_zero_signal``: Bessel std above 1e-6 relative to the rewards' magnitude),
  not "not all equal": rewards that differ by rounding count as equal, and a group kept here is
  exactly a group the optimizer gives a non-zero advantage (an absolute tolerance of its own
  once kept groups the update then trained nothing on, e.g. rewards [10, 10 + 1e-5]).
- Refilling is capped (3 rounds by default; DAPO samples until the batch is full). When the
  cap is hit the step trains on the informative groups it has (fewer than the batch size).
- Each refill round asks for exactly the missing number of prompts (DAPO over-samples a
  whole generation batch).
- No padding of the batch to a multiple of the world size: training runs in one process.
"""

from __future__ import annotations

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller
from rollwise.types import RolloutGroup, is_zero_signal


class DynamicSamplingConfig(StrictModel):
    max_rounds: int = Field(3, ge=0, le=8, description="refill rounds per step at most (the cap)")


def informative(rewards: list[float]) -> bool:
    """Whether a group's rewards carry a signal (``not is_zero_signal``).

    >>> informative([0.0, 1.0, 0.0]), informative([1.0, 1.0, 1.0]), informative([0.3, 0.3 + 1e-9])
    (True, False, False)
    """
    return not is_zero_signal(rewards)


class DynamicSampling(Controller):
    name = "dynamic_sampling"
    refills_dropped_groups = True

    def __init__(self, cfg: DynamicSamplingConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.max_rounds = cfg.max_rounds

    def accept(self, group: RolloutGroup) -> bool:
        return informative(group.live_rewards)  # failed rollouts carry no signal either way
