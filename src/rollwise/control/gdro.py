"""``gdro``: Group DRO for LLM reasoning — "GDRO: Group-level Distributionally Robust
Optimization for RLVR" (2025): Prompt-GDRO and Rollout-GDRO.

Prompts are grouped online by difficulty, the bin of their unbiased pass@8 estimate
(from ``PromptStats``): {0}, (0, .5], (.5, 1), {1}.

- **Prompt-GDRO** (``mode: prompt`` or ``both``) — which prompts: a multiplicative-weights
  bandit over the bins. Each bin's hardness L_g = 1 − mean reward of its prompts' groups is a
  bias-corrected EMA (β = .9); after each step w_g ← w_g · exp(η L_g) (η = .1), and bins are
  drawn from w mixed with 10% uniform, then a prompt from the drawn bin's candidates.
- **Rollout-GDRO** (``mode: rollout`` or ``both``) — how many rollouts: prompt i of bin g
  gets n_i ∝ sqrt(p_g (1 − p_g)) rollouts (p_g the bin's mean pass rate), at least 2, the
  step's budget spent exactly (largest remainder).

Departures from the paper:
- A fifth bin holds prompts never rolled out (their pass@8 is unknown); it takes part in
  the bandit like the others.
- Candidates: the seen prompts (up to ``pool_size``) plus ``fresh_per_step`` stream prompts
  per step (default: as many as the step selects).
- Rollout-GDRO's shadow-price controller is replaced by its fixed point, the square-root
  rule at a fixed mean budget.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, PromptCursor, proportional_split
from rollwise.control.stats import PromptRecord, PromptStats
from rollwise.types import Prompt, RolloutGroup

BINS = ("zero", "low", "high", "one", "unseen")


class GdroConfig(StrictModel):
    mode: Literal["prompt", "rollout", "both"] = Field("both", description="Prompt-GDRO, Rollout-GDRO, or both")
    eta: float = Field(0.1, gt=0, description="multiplicative-weights step size")
    ema: float = Field(0.9, ge=0, lt=1, description="beta of the bias-corrected EMA of each bin's hardness")
    uniform_mix: float = Field(0.1, ge=0, le=1, description="share of uniform in the bin distribution")
    min_rollouts: int = Field(2, ge=1, description="Rollout-GDRO: fewest rollouts a prompt gets")
    k: int = Field(8, ge=1, description="bins use the unbiased pass@k estimate")
    fresh_per_step: int | None = Field(None, ge=0, description="new stream prompts among each step's candidates")
    pool_size: int = Field(1024, ge=1, description="seen prompts kept as candidates")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from c correct of n (Chen et al., 2021); for n < k, 1 − (1 − c/n)^k.

    >>> pass_at_k(8, 0, 8), pass_at_k(8, 1, 8), round(pass_at_k(16, 1, 8), 3)
    (0.0, 1.0, 0.5)
    """
    if n == 0:
        return float("nan")
    if n < k:
        return 1 - (1 - c / n) ** k
    if n - c < k:
        return 1.0
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def difficulty_bin(rec: PromptRecord, k: int = 8) -> int:
    """Index into ``BINS`` of a prompt's record."""
    if rec.attempts == 0:
        return 4
    p = pass_at_k(rec.attempts, rec.successes, k)
    if p <= 0:
        return 0
    if p >= 1:
        return 3
    return 1 if p <= 0.5 else 2


def bin_distribution(weights: np.ndarray, uniform_mix: float) -> np.ndarray:
    """Sampling distribution over bins: the weights normalised, mixed with ``uniform_mix`` of uniform."""
    w = weights / weights.sum()
    return (1 - uniform_mix) * w + uniform_mix / len(w)


def sqrt_allocation(pass_rates: list[float], budget: int, minimum: int = 2) -> list[int]:
    """Rollout-GDRO: n_i ∝ sqrt(p_i (1 − p_i)), at least ``minimum``, summing to ``budget``."""
    return proportional_split([math.sqrt(max(p * (1 - p), 0.0)) for p in pass_rates], budget, minimum)


class Gdro(Controller):
    name = "gdro"
    tracks_pool = True

    def __init__(self, cfg: GdroConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.log_weights = np.zeros(len(BINS))
        self.hardness = np.zeros(len(BINS))  # EMA, not bias-corrected
        self.updates = np.zeros(len(BINS))  # EMA updates per bin (for the bias correction)
        self._last: dict[str, float] = {}

    # Prompt-GDRO ---------------------------------------------------------------------------
    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        if self.cfg.mode == "rollout":
            return source.fresh(n, stats)
        stats.forget(self.cfg.pool_size)
        seen = sum(rec.index >= 0 for rec in stats.records.values())
        want = n if self.cfg.fresh_per_step is None else self.cfg.fresh_per_step
        fresh = source.fresh(max(want, n - seen), stats)  # never fewer candidates than picks
        fresh_ids = {p.id for p in fresh}
        by_bin: list[list] = [[] for _ in BINS]
        for p in fresh:
            by_bin[difficulty_bin(stats.get(p.id), self.cfg.k)].append(p)
        for pid, rec in stats.records.items():
            if pid not in fresh_ids and rec.index >= 0:
                by_bin[difficulty_bin(rec, self.cfg.k)].append(rec.index)
        rng = self.rng()
        q = bin_distribution(np.exp(self.log_weights - self.log_weights.max()), self.cfg.uniform_mix)
        picked, taken = [], set()
        while len(picked) < n:
            avail = np.array([len(b) > 0 for b in by_bin], dtype=float)
            if not avail.any():
                break
            g = int(rng.choice(len(BINS), p=q * avail / (q * avail).sum()))
            item = by_bin[g].pop(int(rng.integers(len(by_bin[g]))))
            prompt = item if isinstance(item, Prompt) else source.revisit(item, stats)
            if prompt.id in taken:
                continue
            taken.add(prompt.id)
            picked.append(prompt)
        self._last = {f"control/bin_weight/{b}": float(x) for b, x in zip(BINS, q)}
        return picked

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        """After the step's groups are scored: each bin's hardness EMA, then the weights."""
        losses: list[list[float]] = [[] for _ in BINS]
        for g in groups:
            rec = stats.get(g.prompt.id)
            before = PromptRecord(attempts=rec.attempts - len(g.rollouts),
                                  successes=rec.successes - sum(r.correct for r in g.rollouts))
            losses[difficulty_bin(before, self.cfg.k)].append(1 - g.pass_rate)
        for b, ls in enumerate(losses):
            if ls:
                self.hardness[b] = self.cfg.ema * self.hardness[b] + (1 - self.cfg.ema) * float(np.mean(ls))
                self.updates[b] += 1
                corrected = self.hardness[b] / (1 - self.cfg.ema ** self.updates[b])
                self.log_weights[b] += self.cfg.eta * corrected

    # Rollout-GDRO --------------------------------------------------------------------------
    def allocate(self, prompts: list[Prompt], stats: PromptStats, budget: int) -> list[int]:
        if self.cfg.mode == "prompt":
            return super().allocate(prompts, stats, budget)
        bins = [difficulty_bin(stats.get(p.id), self.cfg.k) for p in prompts]
        rate = {}
        for b in set(bins):
            recs = [stats.get(p.id) for p, pb in zip(prompts, bins) if pb == b]
            rate[b] = float(np.mean([r.pass_rate for r in recs]))
        budgets = sqrt_allocation([rate[b] for b in bins], budget, self.cfg.min_rollouts)
        if budgets:
            self._last |= {"control/rollouts_min": float(min(budgets)), "control/rollouts_max": float(max(budgets))}
        return budgets

    def metrics(self) -> dict[str, float]:
        return self._last

    def state_dict(self) -> dict:
        return {"log_weights": self.log_weights.tolist(), "hardness": self.hardness.tolist(),
                "updates": self.updates.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.log_weights = np.array(state["log_weights"], dtype=float)
        self.hardness = np.array(state["hardness"], dtype=float)
        self.updates = np.array(state["updates"], dtype=float)
