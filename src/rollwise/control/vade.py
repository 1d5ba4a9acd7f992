"""``vade``: VADE, Variance-Aware Dynamic Sampling via online sample-level difficulty
estimation (2025).

Prompts are chosen before any rollout. Each prompt keeps a Beta(α, β) posterior of its pass
rate (``PromptStats``). A step draws θ̃ ~ Beta(α, β) for every candidate and scores it by
the chance that a group of G rollouts is *not* all-equal,

    score = 1 − θ̃^G − (1 − θ̃)^G,

then takes the top ``n``. Thompson sampling both exploits prompts known to be mixed and
explores uncertain ones. After scoring, (α, β) gain the successes and failures, after a
per-visit decay ×``visit_decay`` (.7); every step all posteriors relax toward the prior,
(α, β) ← 1 + ``step_decay`` ((α, β) − 1) with ``step_decay`` = .99, so the estimates follow the
moving policy (the paper's two-scale decay).

Candidates (``control/pool.py``, shared with GDRO): ``fresh_per_step`` (default: ``n``) new
prompts from the stream, plus every prompt already drawn (kept up to ``pool_size``, the least
recently seen forgotten first). A fresh prompt has the uniform prior and scores 1 − 2/(G+1) in
expectation.

Departures from the paper:
- The candidate set is the seen pool plus fresh stream prompts (the paper scores the whole
  dataset each step); procedural tasks have no finite dataset.
- Decay constants are fixed by config (the paper tunes them per task).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, PromptCursor
from rollwise.control.pool import FreshPerStep, PoolSize, candidates
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt


class VadeConfig(StrictModel):
    visit_decay: float = Field(0.7, gt=0, le=1, description="(alpha, beta) are multiplied by this before each update")
    step_decay: float = Field(0.99, gt=0, le=1,
                              description="per step, (alpha, beta) <- 1 + step_decay * ((alpha, beta) - 1)")
    fresh_per_step: FreshPerStep = None
    pool_size: PoolSize = 1024


def vade_scores(alpha: np.ndarray, beta: np.ndarray, g: int, rng: np.random.Generator) -> np.ndarray:
    """Thompson scores 1 − θ̃^G − (1 − θ̃)^G with θ̃ ~ Beta(alpha, beta), one per candidate."""
    theta = rng.beta(alpha, beta)
    return 1 - theta**g - (1 - theta) ** g


class Vade(Controller):
    name = "vade"

    def __init__(self, cfg: VadeConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self._last: dict[str, float] = {}

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        stats.visit_decay = self.cfg.visit_decay
        stats.decay_toward_prior(self.cfg.step_decay)
        cands = candidates(source, stats, n, self.cfg.fresh_per_step, self.cfg.pool_size)
        recs = cands.records(stats)
        scores = vade_scores(np.array([r.alpha for r in recs]), np.array([r.beta for r in recs]),
                             self.num_generations, self.rng())
        top = np.argsort(-scores, kind="stable")[:n]
        picked = cands.prompts(top, source, stats)
        self._last = {"control/picked_fresh": sum(i < len(cands.fresh) for i in top) / max(len(top), 1),
                      "control/picked_pass_rate": float(np.mean([recs[i].pass_rate for i in top])) if len(top) else 0.0,
                      "control/pool": float(len(cands))}
        return picked

    def metrics(self) -> dict[str, float]:
        return self._last
