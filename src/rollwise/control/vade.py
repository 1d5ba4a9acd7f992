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

Candidates: ``fresh_per_step`` (default: ``n``) new prompts from the stream, plus every prompt
already drawn (kept up to ``pool_size``, the least recently seen forgotten first). A fresh
prompt has the uniform prior and scores 1 − 2/(G+1) in expectation.

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
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt


class VadeConfig(StrictModel):
    visit_decay: float = Field(0.7, gt=0, le=1, description="(alpha, beta) are multiplied by this before each update")
    step_decay: float = Field(0.99, gt=0, le=1,
                              description="per step, (alpha, beta) <- 1 + step_decay * ((alpha, beta) - 1)")
    fresh_per_step: int | None = Field(None, ge=0, description="new stream prompts among each step's candidates "
                                       "(null = as many as the step selects)")
    pool_size: int = Field(1024, ge=1, description="seen prompts kept as candidates (least recently seen forgotten)")


def vade_scores(alpha: np.ndarray, beta: np.ndarray, g: int, rng: np.random.Generator) -> np.ndarray:
    """Thompson scores 1 − θ̃^G − (1 − θ̃)^G with θ̃ ~ Beta(alpha, beta), one per candidate."""
    theta = rng.beta(alpha, beta)
    return 1 - theta**g - (1 - theta) ** g


class Vade(Controller):
    name = "vade"
    tracks_pool = True

    def __init__(self, cfg: VadeConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self._last: dict[str, float] = {}

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        stats.visit_decay = self.cfg.visit_decay
        stats.decay_toward_prior(self.cfg.step_decay)
        stats.forget(self.cfg.pool_size)
        pool = [pid for pid, rec in stats.records.items() if rec.index >= 0]
        want = n if self.cfg.fresh_per_step is None else self.cfg.fresh_per_step
        fresh = source.fresh(max(want, n - len(pool)), stats)  # never fewer candidates than picks
        fresh_ids = {p.id for p in fresh}
        pool = [pid for pid in pool if pid not in fresh_ids]
        ids = [p.id for p in fresh] + pool
        recs = [stats.get(pid) for pid in ids]
        scores = vade_scores(np.array([r.alpha for r in recs]), np.array([r.beta for r in recs]),
                             self.num_generations, self.rng())
        top = np.argsort(-scores, kind="stable")[:n]
        by_id = {p.id: p for p in fresh}
        picked = [by_id.get(ids[i]) or source.revisit(recs[i].index, stats) for i in top]
        self._last = {"control/picked_fresh": sum(ids[i] in fresh_ids for i in top) / max(len(top), 1),
                      "control/picked_pass_rate": float(np.mean([recs[i].pass_rate for i in top])) if len(top) else 0.0,
                      "control/pool": float(len(ids))}
        return picked

    def metrics(self) -> dict[str, float]:
        return self._last
