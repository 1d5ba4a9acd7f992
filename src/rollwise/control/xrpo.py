"""``xrpo_alloc``: XRPO's rollout allocator — "XRPO: Pushing the Limits of GRPO with Targeted
Exploration and Exploitation" (2025), the exploration half.

Instead of ``num_generations`` rollouts for every prompt, a step samples ``initial`` (n0 = 4)
per prompt, scores them, and spends the rest of the step's budget (``prompts × G`` rollouts)
where one more chunk of rollouts reduces the uncertainty of the pass-rate estimate most:

    p̃ = (s + 1) / (n + 2),   priority = p̃ (1 − p̃) / (n (n + 1))

greedily, ``chunk`` (4) rollouts at a time, the chosen prompt's n growing by the chunk; no
prompt gets more than ``max_factor`` × G (4G). The step spends exactly its budget.

Departures from the paper:
- The priority uses the counts of this step only (n0 plus chunks given so far), not a
  t-statistic over the run's history; p̃ stays at the observed value while chunks are
  assigned (no look-ahead of their outcomes).
- The exploitation half (novelty-sharpened advantages) is the objective preset
  ``novelty_sharpen`` and composes with this allocator; nothing here changes the loss.
- The chunks are sampled in one more round (the second phase), not interleaved with scoring.
"""

from __future__ import annotations

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, equal_split
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup


class XrpoConfig(StrictModel):
    initial: int = Field(4, ge=2, description="n0: rollouts every prompt gets in the first phase")
    chunk: int = Field(4, ge=1, description="rollouts given at a time in the second phase")
    max_factor: int = Field(4, ge=1, description="no prompt gets more than max_factor x num_generations rollouts")


def xrpo_priority(n: int, s: int) -> float:
    """Expected uncertainty reduction of one more chunk: p̃(1−p̃)/(n(n+1)), p̃ = (s+1)/(n+2).

    >>> round(xrpo_priority(4, 2), 4), round(xrpo_priority(4, 4), 4)
    (0.0125, 0.0069)
    """
    p = (s + 1) / (n + 2)
    return p * (1 - p) / (n * (n + 1))


def xrpo_allocation(counts: list[int], successes: list[int], budget: int, chunk: int, cap: int) -> list[int]:
    """Extra rollouts per prompt, summing to ``budget`` (less only if every prompt reaches ``cap``):
    greedy by ``xrpo_priority``, ``chunk`` at a time (the last chunk may be smaller); ties go to
    the lower index. The pass rate stays at the observed s/n while n grows."""
    extra = [0] * len(counts)
    left = budget
    while left > 0:
        best, best_score = None, -1.0
        for i, (n, s) in enumerate(zip(counts, successes)):
            room = cap - n - extra[i]
            if room <= 0:
                continue
            m = n + extra[i]
            score = xrpo_priority(m, round(s * m / n) if n else 0)
            if score > best_score:
                best, best_score = i, score
        if best is None:
            break
        give = min(chunk, left, cap - counts[best] - extra[best])
        extra[best] += give
        left -= give
    return extra


class XrpoAlloc(Controller):
    name = "xrpo_alloc"
    max_rounds = 1

    def __init__(self, cfg: XrpoConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self._last: dict[str, float] = {}

    def allocate(self, prompts: list[Prompt], stats: PromptStats, budget: int) -> list[int]:
        n0 = self.cfg.initial
        if n0 * len(prompts) > budget:  # a refill or a tiny budget: no second phase
            return equal_split(budget, len(prompts))
        return [n0] * len(prompts)

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        counts = [len(g.rollouts) for g in groups]
        successes = [sum(r.correct for r in g.rollouts) for g in groups]
        cap = self.cfg.max_factor * self.num_generations
        extra = xrpo_allocation(counts, successes, remaining, self.cfg.chunk, cap)
        totals = [c + e for c, e in zip(counts, extra)]
        if totals:
            self._last = {"control/rollouts_min": float(min(totals)), "control/rollouts_max": float(max(totals))}
        return extra

    def metrics(self) -> dict[str, float]:
        return self._last
