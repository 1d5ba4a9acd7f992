"""``gdro``: Group DRO for LLM reasoning — "Group Distributionally Robust Optimization-Driven
Reinforcement Learning for LLM Reasoning" (Panaganti et al., 2026, arXiv:2601.19280):
Prompt-GDRO and Rollout-GDRO.

Prompts are grouped online by difficulty, the bin of their unbiased pass@8 estimate
(from ``PromptStats``): {0}, (0, .5], (.5, 1), {1}.

- **Prompt-GDRO** (``mode: prompt`` or ``both``) — which prompts: the paper's EMA-debiased
  EXP3P adversary (its §3.2.1). Each bin keeps a score S_b, a bias-corrected EMA (β = .9 on the
  old value) of ℓ̄_b, the mean prompt-level loss of the step's groups from that bin (eqs. 12–13);
  the bin weights are ω_b = exp(η S_b) (eq. 14, η = 2) and q_b = (1 − γ) ω_b / Σω + γ / B
  (eq. 15, γ = .1). The weight is a function of the bin's *recent mean* loss, not a running
  sum: a bin drawn often does not gain weight for being drawn (the frequency bias the paper's
  debiasing removes), and a bin not drawn keeps its last score.
- The loss is the paper's: ℓ(x) = −(1/n) Σ_j min(ρ_j A_j, clip(ρ_j, 1 ± ε) A_j) with GRPO's
  standardised advantages A_j (eqs. 3, 5–7; KL term omitted), ``clipped_surrogate_loss``. At
  the sampling policy (ρ = 1) it is 0 for every group, so the controller scores a group by the
  loss one clipped step can remove, (ℓ(1) − ℓ(1 ± ε)) / ε = mean |A_j| (``loss_at_stake``): 0
  for a group whose rewards all agree (never or always solved: nothing to learn), 2√(p(1−p))
  for binary rewards otherwise.
- Prompt-GDRO is realised by sampling: each pick draws a candidate with probability ∝ q of its
  bin, so bin b is drawn ∝ (its candidates) × q_b — in expectation the paper's realisation,
  which keeps the batch and multiplies each prompt's advantages by its bin's weight (eq. 16).
- **Rollout-GDRO** (``mode: rollout`` or ``both``) — how many rollouts: prompt i of bin g
  gets n_i ∝ sqrt(p_g (1 − p_g)) rollouts (p_g the bin's mean pass rate), at least 2, the
  step's budget spent exactly (largest remainder).

Departures from the paper:
- Prompt-GDRO resamples prompts (above) instead of reweighting advantages; the loss is scored
  before the update, as the reducible clipped-surrogate loss, not after it; η = 2 because that
  loss lies in [0, 1] (the released runs use η = .65 on the raw surrogate); no clip of S (it
  is bounded); no normalisation of ℓ̄_b by the bin's batch share (optional in the paper).
- Four fixed bins (the paper sweeps up to 10, with hysteresis), plus a fifth for prompts never
  rolled out (their pass@8 is unknown); it takes part in the bandit like the others.
- Candidates: the seen prompts (up to ``pool_size``) plus ``fresh_per_step`` stream prompts
  per step (default: as many as the step selects), as VADE's (``control/pool.py``).
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
from rollwise.control.pool import FreshPerStep, PoolSize, candidates
from rollwise.control.stats import PromptRecord, PromptStats
from rollwise.types import Prompt, RolloutGroup

BINS = ("zero", "low", "high", "one", "unseen")


class GdroConfig(StrictModel):
    mode: Literal["prompt", "rollout", "both"] = Field("both", description="Prompt-GDRO, Rollout-GDRO, or both")
    eta: float = Field(2.0, gt=0, description="eta of the bin weights exp(eta * S_b)")
    ema: float = Field(0.9, ge=0, lt=1, description="old value's weight in the bias-corrected EMA S_b of a bin's loss")
    clip: float = Field(0.2, gt=0, lt=1, description="epsilon of the clipped surrogate that scores a group's loss")
    uniform_mix: float = Field(0.1, ge=0, le=1, description="share of uniform in the bin distribution")
    min_rollouts: int = Field(2, ge=1, description="Rollout-GDRO: fewest rollouts a prompt gets")
    k: int = Field(8, ge=1, description="bins use the unbiased pass@k estimate")
    fresh_per_step: FreshPerStep = None
    pool_size: PoolSize = 1024


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


def grpo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """A_j = (r_j − mean) / (std + eps), the population std (the paper's eq. 3)."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def clipped_surrogate_loss(advantages: list[float], ratios: list[float], clip_low: float = 0.2,
                           clip_high: float = 0.2) -> float:
    """The paper's prompt-level loss (eqs. 5–7 without the KL term): the mean over the group's
    rollouts of −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A), ρ a rollout's (token-mean) ratio.

    >>> round(clipped_surrogate_loss([1.0, -1.0], [1.3, 0.9]), 6)  # -(1.2) and +(0.9), halved
    -0.15
    """
    terms = [-min(r * a, min(max(r, 1 - clip_low), 1 + clip_high) * a) for a, r in zip(advantages, ratios)]
    return sum(terms) / len(terms)


def loss_at_stake(rewards: list[float], clip: float = 0.2) -> float:
    """What one clipped step can remove from the loss of a group with these rewards, per unit of
    ε: (ℓ(ρ = 1) − ℓ(ρ = 1 + ε·sign A)) / ε = mean |A| — 0 when the rewards all agree.

    >>> loss_at_stake([1, 1, 1, 1]), loss_at_stake([0, 0, 0, 0]), round(loss_at_stake([1, 0, 1, 0]), 4)
    (0.0, 0.0, 1.0)
    """
    adv = grpo_advantages([float(r) for r in rewards])
    best = [1 + clip if a > 0 else 1 - clip if a < 0 else 1.0 for a in adv]
    at_one = clipped_surrogate_loss(adv, [1.0] * len(adv), clip, clip)
    return (at_one - clipped_surrogate_loss(adv, best, clip, clip)) / clip


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
    """q over bins: the weights normalised, mixed with ``uniform_mix`` of uniform (the paper's eq. 15)."""
    w = weights / weights.sum()
    return (1 - uniform_mix) * w + uniform_mix / len(w)


def bin_weights(scores: np.ndarray, eta: float, uniform_mix: float) -> np.ndarray:
    """q_b from the bins' scores S_b: ω_b = exp(η S_b) (eq. 14), then ``bin_distribution``."""
    return bin_distribution(np.exp(eta * (scores - scores.max())), uniform_mix)


def sqrt_allocation(pass_rates: list[float], budget: int, minimum: int = 2) -> list[int]:
    """Rollout-GDRO: n_i ∝ sqrt(p_i (1 − p_i)), at least ``minimum``, summing to ``budget``."""
    return proportional_split([math.sqrt(max(p * (1 - p), 0.0)) for p in pass_rates], budget, minimum)


class Gdro(Controller):
    name = "gdro"

    def __init__(self, cfg: GdroConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.scores = np.zeros(len(BINS))  # EMA of each bin's mean loss, not bias-corrected
        self.observed_steps = np.zeros(len(BINS))  # steps that updated each bin's EMA (for the bias correction)
        self._last: dict[str, float] = {}

    def corrected_scores(self) -> np.ndarray:
        """S_b: the bias-corrected EMAs (0 for a bin never observed)."""
        seen = self.observed_steps > 0
        out = np.zeros(len(BINS))
        out[seen] = self.scores[seen] / (1 - self.cfg.ema ** self.observed_steps[seen])
        return out

    def bin_probabilities(self) -> np.ndarray:
        """q over ``BINS`` (the paper's eqs. 14–15)."""
        return bin_weights(self.corrected_scores(), self.cfg.eta, self.cfg.uniform_mix)

    # Prompt-GDRO ---------------------------------------------------------------------------
    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        if self.cfg.mode == "rollout":
            return source.fresh(n, stats)
        cands = candidates(source, stats, n, self.cfg.fresh_per_step, self.cfg.pool_size)
        bins = [difficulty_bin(rec, self.cfg.k) for rec in cands.records(stats)]
        q = self.bin_probabilities()
        # each candidate ∝ q of its bin: bin b drawn ∝ (its candidates) x q_b, the resampling
        # equivalent of the paper's per-bin advantage weights
        p = q[bins] / q[bins].sum()
        count = min(n, len(cands))
        order = self.rng().choice(len(cands), size=count, replace=False, p=p).tolist() if count else []
        picked = cands.prompts(order, source, stats)
        self._last = {f"control/bin_weight/{b}": float(x) for b, x in zip(BINS, q)}
        self._last |= {f"control/bin_drawn/{b}": float(sum(bins[i] == j for i in order)) for j, b in enumerate(BINS)}
        return picked

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        """After the step's groups are scored: each present bin's mean loss into its EMA (eqs. 12–13)."""
        losses: list[list[float]] = [[] for _ in BINS]
        for g in groups:
            if not g.rollouts:
                continue
            rec = stats.get(g.prompt.id)
            live = [r for r in g.rollouts if r.failure is None]  # what PromptStats.observe added
            if not live:
                continue
            before = PromptRecord(attempts=rec.attempts - len(live),
                                  successes=rec.successes - sum(r.correct for r in live))
            losses[difficulty_bin(before, self.cfg.k)].append(loss_at_stake(g.live_rewards, self.cfg.clip))
        for b, ls in enumerate(losses):
            if ls:
                self.scores[b] = self.cfg.ema * self.scores[b] + (1 - self.cfg.ema) * float(np.mean(ls))
                self.observed_steps[b] += 1
        self._last |= {f"control/bin_score/{b}": float(x) for b, x in zip(BINS, self.corrected_scores())}

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
        return {"scores": self.scores.tolist(), "updates": self.observed_steps.tolist()}  # "updates": checkpoints' key

    def load_state_dict(self, state: dict) -> None:
        if "scores" not in state:
            raise ValueError("gdro: this checkpoint holds the bandit state of the old update (log_weights, hardness), "
                             "which the paper's EMA-debiased update does not continue; start the run again")
        self.scores = np.array(state["scores"], dtype=float)
        self.observed_steps = np.array(state["updates"], dtype=float)
