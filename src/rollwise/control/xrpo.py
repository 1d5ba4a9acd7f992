"""``xrpo_alloc``: XRPO's rollout allocator — "XRPO: Pushing the Limits of GRPO with Targeted
Exploration and Exploitation" (Bamba et al., 2025, arXiv:2510.06672), the exploration half.

Instead of ``num_generations`` rollouts for every prompt, a step samples ``initial`` (n0 = 4)
per prompt, scores them, and spends the rest of the step's budget (``prompts × G`` rollouts)
where one more rollout shrinks the confidence interval of the prompt's mean reward most. The
paper's priority (its §3, hierarchical rollout planning):

    h_q(n) = t_{1−α/2, n−1} · s_q / √n                  (half-width of the t interval, α = .05)
    Π_q    = [h_q(n_q) − h_q(n_q + 1)] + λ √(ln(1 + T) / n_q)

with s_q the sample standard deviation of the prompt's rewards and T the training step. A
prompt whose rollouts all agree (s_q = 0: never or always solved) gains nothing from the
first term and competes through the exploration bonus alone, so the budget goes to the
uncertain prompts: at G = 8, n0 = 4 a prompt with 2 of 4 correct scores ≈ .20 against ≈ .01
for an all-wrong one. Rollouts are given greedily, ``chunk`` (4) at a time to the prompt of
highest Π, its n growing by the chunk; no prompt gets more than ``max_factor`` × G (4G). The
step spends exactly its budget.

When the budget leaves no second phase (``initial`` ≥ ``num_generations``, or a refill or
tiny budget where n0 per prompt does not fit) every prompt gets the same count, which is the
baseline: the controller logs a warning once and reports ``control/xrpo_free_share`` (the
share of the step's budget the second phase could place) every step.

Departures from the paper:
- The counts and s_q are this step's (n0 plus chunks given so far), not the run's history of
  the prompt; s_q stays at the first phase's value while chunks are assigned (no look-ahead of
  their outcomes).
- Chunks of 4 rollouts, not single rollouts; λ = .01 (a tie-break among prompts whose rewards
  agree, so allocation follows the uncertainty term).
- No in-context seeding of all-wrong prompts.
- The exploitation half (novelty-sharpened advantages) is the objective preset
  ``novelty_sharpen`` and composes with this allocator; nothing here changes the loss.
- The chunks are sampled in one more round (the second phase), not interleaved with scoring.
"""

from __future__ import annotations

import logging
import math

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, equal_split
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup

log = logging.getLogger(__name__)


class XrpoConfig(StrictModel):
    initial: int = Field(4, ge=2, description="n0: rollouts every prompt gets in the first phase")
    chunk: int = Field(4, ge=1, description="rollouts given at a time in the second phase")
    max_factor: int = Field(4, ge=1, description="no prompt gets more than max_factor x num_generations rollouts")
    alpha: float = Field(0.05, gt=0, lt=1, description="the t interval's level is 1 - alpha")
    bonus: float = Field(0.01, ge=0, description="lambda of the exploration bonus lambda*sqrt(ln(1+step)/n)")


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > .5) of Student's t with ``df`` degrees of freedom, by bisection on the
    exact integer-df CDF (Abramowitz & Stegun 26.7.3–4).

    >>> round(t_quantile(0.975, 1), 3), round(t_quantile(0.975, 3), 3), round(t_quantile(0.975, 30), 3)
    (12.706, 3.182, 2.042)
    """
    target = 2 * p - 1  # P(|T| <= t)

    def central(t: float) -> float:
        theta = math.atan(t / math.sqrt(df))
        c2 = math.cos(theta) ** 2
        if df % 2:  # odd: (2/pi)(theta + sin cos (1 + 2/3 c^2 + 2.4/3.5 c^4 + ...))
            term, total = 1.0, 1.0 if df > 1 else 0.0
            for k in range(1, (df - 1) // 2):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
            return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
        term, total = 1.0, 1.0  # even: sin (1 + 1/2 c^2 + 1.3/2.4 c^4 + ...)
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total

    lo, hi = 0.0, 1.0
    while central(hi) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if central(mid) < target else (lo, mid)
    return (lo + hi) / 2


def half_width(n: int, std: float, alpha: float = 0.05) -> float:
    """h(n) = t_{1−α/2, n−1} · s / √n: half the width of the t interval for a mean of ``n`` samples."""
    return t_quantile(1 - alpha / 2, n - 1) * std / math.sqrt(n)


def xrpo_priority(n: int, std: float, bonus: float = 0.0, alpha: float = 0.05) -> float:
    """Π = h(n) − h(n + 1) + bonus / √n, s held at ``std`` (``bonus`` = λ√ln(1 + T)); a prompt with
    fewer than two rollouts has no interval yet and comes first (∞).

    >>> round(xrpo_priority(4, (4 / 3 * 0.25) ** 0.5), 3), xrpo_priority(4, 0.0)  # 2 of 4 correct; all wrong
    (0.202, 0.0)
    """
    if n < 2:
        return math.inf
    return half_width(n, std, alpha) - half_width(n + 1, std, alpha) + bonus / math.sqrt(n)


def sample_std(values: list[float]) -> float:
    """Standard deviation with n − 1 in the denominator (0 for fewer than two values)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def xrpo_allocation(counts: list[int], stds: list[float], budget: int, chunk: int, cap: int,
                    bonus: float = 0.0, alpha: float = 0.05) -> list[int]:
    """Extra rollouts per prompt, summing to ``budget`` (less only if every prompt reaches ``cap``):
    greedy by ``xrpo_priority``, ``chunk`` at a time (the last chunk may be smaller); ties go to
    the prompt with fewer rollouts, then the lower index. Each prompt's s stays at ``stds[i]``
    while its n grows."""
    extra = [0] * len(counts)
    left = budget
    while left > 0:
        best, best_key = None, (-math.inf, 0)
        for i, (n, s) in enumerate(zip(counts, stds)):
            if cap - n - extra[i] <= 0:
                continue
            key = (xrpo_priority(n + extra[i], s, bonus, alpha), -(n + extra[i]))
            if key > best_key:
                best, best_key = i, key
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
        self._warned = False

    def allocate(self, prompts: list[Prompt], stats: PromptStats, budget: int) -> list[int]:
        n0 = self.cfg.initial
        first = [n0] * len(prompts) if n0 * len(prompts) <= budget else equal_split(budget, len(prompts))
        free = budget - sum(first)  # what the second phase may place
        self._last = {"control/xrpo_free_share": free / budget if budget else 0.0}
        if prompts and free == 0 and not self._warned:
            self._warned = True
            log.warning("xrpo_alloc: the step's budget (%d rollouts for %d prompts) leaves no second phase at "
                        "control.xrpo_alloc.initial=%d: every prompt gets the same rollouts, as without control; "
                        "raise rollout.num_generations above initial", budget, len(prompts), n0)
        return first

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        counts = [len(g.rollouts) for g in groups]
        stds = [sample_std(g.live_rewards) for g in groups]  # failed rollouts say nothing about the prompt
        cap = self.cfg.max_factor * self.num_generations
        bonus = self.cfg.bonus * math.sqrt(math.log1p(self.step))
        extra = xrpo_allocation(counts, stds, remaining, self.cfg.chunk, cap, bonus, self.cfg.alpha)
        totals = [c + e for c, e in zip(counts, extra)]
        if totals:
            self._last |= {"control/rollouts_min": float(min(totals)), "control/rollouts_max": float(max(totals))}
        return extra

    def metrics(self) -> dict[str, float]:
        return self._last
