"""``control.method: v05``: the control half of V_{0.5} — the prior's test, the extra rollouts, the baseline.

``objective.method: v05`` turns it on (the preset fills ``control.method: v05``; the rule and
the paper: ``rollwise.optim.v05``). After a step's first round the controller tests each group's
mean against its prior V_0 (|r̄ − V_0| > 1.96·sqrt(σ²/n + τ²)); a rejected group gets n more
rollouts in one extend round (on top of the step's budget, ``control/extend_tokens``) and w = 0.
Once the rounds are done (``observe_step``) it writes each group's fused baseline b on its
rollouts (``Rollout.value_baseline``), which ``objective.advantage: v05`` subtracts. τ² is the
running mean of (V_0 − r̄)² over groups with n ≥ ``min_n`` (16), ``tau2_init`` until one is seen.

V_0 (``prior``): ``running`` — the prompt's mean reward in earlier steps when it was seen, else the
running mean reward of earlier groups (0.5 before any) — or ``package.module:function`` called as
``fn(prompt) -> float | None`` (None: the running value). The paper's generalist value model is not
available here; plug yours in. τ², the running means and the seen prompts are saved in checkpoints.
"""

from __future__ import annotations

import math

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.control.base import Controller
from rollwise.control.stats import PromptStats
from rollwise.imports import import_spec
from rollwise.types import RolloutGroup


def v05_baseline(mean: float, n: int, v0: float, tau2: float, z: float = 1.96) -> tuple[float, float, float, bool]:
    """(b, w, the test statistic, rejected) for a group of ``n`` rewards with mean ``mean``.

    >>> b, w, stat, rejected = v05_baseline(0.5, 4, 0.7, 0.0625)
    >>> round(b, 6), round(w, 6), round(stat, 2), rejected
    (0.6, 0.5, 0.57, False)
    """
    p = min(max(mean, 1 / (2 * n)), 1 - 1 / (2 * n))
    var = p * (1 - p) / n  # σ²/n
    spread = var + tau2
    w = var / spread if spread > 0 else 0.0
    stat = abs(mean - v0) / math.sqrt(spread) if spread > 0 else 0.0
    rejected = stat > z
    if rejected:
        w = 0.0
    return w * v0 + (1 - w) * mean, w, stat, rejected



class V05Config(StrictModel):
    prior: str = Field("running", description="V_0: running (the prompt's earlier mean reward, else the running "
                       "mean of earlier groups) or package.module:function(prompt) -> float | None")
    tau2_init: float = Field(0.0625, ge=0, description="τ² until a group of min_n rollouts has been seen")
    min_n: int = Field(16, ge=1, description="groups of at least this many rollouts update τ²")
    z: float = Field(1.96, gt=0, description="reject the prior when |r̄ - V_0| > z·sqrt(σ²/n + τ²)")


class V05(Controller):
    name = "v05"
    max_rounds = 1  # one extend round: n more rollouts for the groups whose prior was rejected

    def __init__(self, cfg: V05Config, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.user_prior = None
        if cfg.prior != "running":
            self.user_prior = import_spec(cfg.prior, "control.v05.prior", what="callable")
            if not callable(self.user_prior):
                raise ConfigError(f"control.v05.prior: '{cfg.prior}' is not callable (want fn(prompt) -> float | None)")
        self.tau_sum, self.tau_count = 0.0, 0  # Σ (V_0 − r̄)² and count over groups with n >= min_n
        self.seen: dict[str, list[float]] = {}  # prompt id -> [reward sum, count] from earlier steps
        self.total, self.groups_seen = 0.0, 0  # Σ group means and count of earlier groups
        self.rejected: set[str] = set()  # this step's prompts whose prior was rejected
        self.tested_step: int | None = None
        self.last: dict[str, float] = {}

    @property
    def tau2(self) -> float:
        return self.tau_sum / self.tau_count if self.tau_count else self.cfg.tau2_init

    def prior(self, group: RolloutGroup) -> float:
        """V_0 of the group's prompt (before this step's rollouts)."""
        if self.user_prior is not None:
            value = self.user_prior(group.prompt)
            if value is not None:
                return float(value)
        if group.prompt.id in self.seen:
            s, n = self.seen[group.prompt.id]
            return s / n
        return self.total / self.groups_seen if self.groups_seen else 0.5

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        if self.tested_step == self.step:  # one test per step, after the first round
            return [0] * len(groups)
        self.tested_step, self.rejected = self.step, set()
        extra = []
        for g in groups:
            rewards = g.live_rewards
            n = len(rewards)
            rejected = n > 0 and v05_baseline(sum(rewards) / n, n, self.prior(g), self.tau2, self.cfg.z)[3]
            if rejected:
                self.rejected.add(g.prompt.id)
            extra.append(n if rejected else 0)
        return extra

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        """Each group's fused baseline b on its rollouts; then τ² and the running priors learn this step."""
        weights, updates = [], []
        for g in groups:
            rewards = g.live_rewards
            if not rewards:
                continue
            n, mean, v0 = len(rewards), sum(rewards) / len(rewards), self.prior(g)
            b, w, _, rejected = v05_baseline(mean, n, v0, self.tau2, self.cfg.z)
            if g.prompt.id in self.rejected or rejected:
                b, w = mean, 0.0
            for r in g.rollouts:
                r.value_baseline = b
            weights.append(w)
            updates.append((g.prompt.id, n, mean, v0))
        for pid, n, mean, v0 in updates:  # after every baseline: this step's outcomes are not its own prior
            if n >= self.cfg.min_n:
                self.tau_sum, self.tau_count = self.tau_sum + (v0 - mean) ** 2, self.tau_count + 1
            s = self.seen.setdefault(pid, [0.0, 0])
            s[0], s[1] = s[0] + mean * n, s[1] + n
            self.total, self.groups_seen = self.total + mean, self.groups_seen + 1
        self.last = {"control/v05_w": sum(weights) / max(len(weights), 1),
                     "control/v05_rejected": float(len(self.rejected)), "control/v05_tau2": self.tau2}

    def metrics(self) -> dict[str, float]:
        return self.last

    def state_dict(self) -> dict:
        return {"tau_sum": self.tau_sum, "tau_count": self.tau_count, "seen": self.seen, "total": self.total,
                "groups_seen": self.groups_seen}

    def load_state_dict(self, state: dict) -> None:
        self.tau_sum, self.tau_count = state["tau_sum"], state["tau_count"]
        self.seen, self.total, self.groups_seen = state["seen"], state["total"], state["groups_seen"]
