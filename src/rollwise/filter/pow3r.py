"""``pow3r``: rubric criterion weights that follow what separates the current rollouts (POW3R).

POW3R, "Policy-Aware Rubric Rewards": the reward is r_i = Σ_c ŵ_c·s_{i,c} over rubric criteria
c. The human weights w_c and each category's total stay the objective, but criteria that
separate the policy's current outputs gain weight and saturated or unreachable ones lose it —
a drop-in for GRPO.

The rule (``pow3r_weights``; METHODS.md's choices):

- contrast_c = the mean over groups of the within-group std (Bessel) of s_c;
- ŵ_c ∝ w_c·(contrast_c + floor), floor = .05, renormalised so each category keeps its human
  total Σ_{c in category} w_c;
- smoothed across scoring calls by an EMA of .9 (ŵ ← .9·ŵ_prev + .1·ŵ_now), started at the
  first call's ŵ.

So criteria (w .5, contrast .4) and (w .5, contrast 0) in one category get ŵ = (.9, .1), and
equal contrasts give ŵ = w.

A criterion is any reward by name (a built-in, the task's, ``package.module:function``) — the
CPU half, on existing components — or a rubric criterion graded by a model: ``name: judge``
with its ``judge:`` section (``rollwise.filter.judge``). ``rewards: [{name: pow3r, pow3r:
{criteria: [...]}}]``; each criterion is called once per scoring call (a judge: one batch).

Where we depart: the paper's criteria are LLM-graded rubric items on open-ended tasks; the
default testbed here is arith with two rule criteria (``arith``: the answer, ``arith_working``:
the column working, ``rollwise.filter.fapo``). Criterion weights live in the reward object and
the checkpoint keeps them (``rewards.pt``): a resumed run continues its EMA. A controller's extra rounds are scored as
their own calls and move the EMA too. The paper's gains (fewer steps to a plateau on open-ended
rubrics) need a model and a judge that grade real rubrics — a bigger model or a served judge.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.filter.judge import JudgeByName, JudgeConfig
from rollwise.filter.rewards import call_reward, finite, load_state, reward_inputs, state_of
from rollwise.types import RolloutGroup, Score


class Pow3rCriterion(JudgeByName):
    """One rubric criterion: a reward by name (or a judge with its rubric), its human weight and category."""

    name: str = Field(description="a reward known to `rollwise list rewards`, 'package.module:function', or judge")
    weight: float = Field(1.0, gt=0, description="the human weight w_c")
    category: str = Field("rubric", description="criteria of one category share its human total")
    judge: JudgeConfig | None = Field(None, description="name: judge — the rubric criterion's judge and rubric")


class Pow3rConfig(StrictModel):
    """The rubric (``rewards: [{name: pow3r, pow3r: {...}}]``)."""

    criteria: list[Pow3rCriterion] = Field(
        default_factory=lambda: [Pow3rCriterion(name="arith"), Pow3rCriterion(name="arith_working")],
        min_length=1, description="criteria c with w_c and category (default: arith's answer and its working)")
    floor: float = Field(0.05, ge=0, description="ŵ_c ∝ w_c·(contrast_c + floor)")
    ema: float = Field(0.9, ge=0, lt=1, description="ŵ ← ema·ŵ_prev + (1 − ema)·ŵ_now across scoring calls")


def group_contrast(values: Sequence[float], group_sizes: Sequence[int]) -> float:
    """The mean over groups (of 2+ rollouts) of the Bessel std of one criterion's scores.

    >>> group_contrast([1, 0, 1, 1], [2, 2])
    0.3535533905932738
    """
    stds, i = [], 0
    for n in group_sizes:
        if n >= 2:
            stds.append(statistics.stdev(values[i: i + n]))
        i += n
    return sum(stds) / len(stds) if stds else 0.0


def pow3r_weights(weights: Sequence[float], contrasts: Sequence[float], categories: Sequence[str],
                  floor: float = 0.05) -> list[float]:
    """ŵ_c ∝ w_c·(contrast_c + floor), each category renormalised to its human total Σ w_c.

    >>> [round(x, 6) for x in pow3r_weights([.5, .5], [.4, 0.0], ["a", "a"])]
    [0.9, 0.1]
    >>> pow3r_weights([.3, .7], [.2, .2], ["a", "a"])
    [0.3, 0.7]
    """
    raw = [w * (c + floor) for w, c in zip(weights, contrasts)]
    out = []
    for w, r, cat in zip(weights, raw, categories):
        total = sum(x for x, k in zip(weights, categories) if k == cat)
        mass = sum(x for x, k in zip(raw, categories) if k == cat)
        out.append(total * r / mass if mass > 0 else w)  # floor 0 and no contrast anywhere: the human weights
    return out


class Pow3r:
    """POW3R: a weighted rubric whose criterion weights follow each criterion's within-group
    contrast (saturated criteria lose weight, each category keeps its human total)."""

    __name__ = "pow3r"

    def __init__(self, cfg: Pow3rConfig, criteria: list[tuple[str, Callable]]):
        self.cfg = cfg
        self.names = [name for name, _ in criteria]
        self.fns = [fn for _, fn in criteria]
        self.weights: list[float] | None = None  # ŵ, smoothed; None until the first call
        self.verifier_name = self.names[0]  # the first criterion (the answer check) is the eval judge's

    def state_dict(self) -> dict:
        """The smoothed weights ŵ and the criteria's own state (a judge's cache), for the checkpoint."""
        return {"weights": self.weights, "criteria": [state_of(fn) for fn in self.fns]}

    def load_state_dict(self, state: dict) -> None:
        self.weights = state.get("weights")
        for fn, sub in zip(self.fns, state.get("criteria", [])):
            load_state(fn, sub)

    def scores(self, groups: list[RolloutGroup]) -> tuple[list[list[float]], list, dict[str, float]]:
        """s_{i,c} per criterion (a criterion that raises or gives a non-finite value scores 0), the
        answers the first criterion read (what maj@k votes with), and the criteria's own metrics
        (a judge's tokens)."""
        pairs = [(g, r) for g in groups for r in g.rollouts]
        prompts, completions, kwargs = reward_inputs(pairs)
        out, answers, metrics = [], [None] * len(pairs), {}
        for name, fn in zip(self.names, self.fns):
            try:
                values = call_reward(fn, prompts, completions, dict(kwargs))
                if len(values) != len(pairs):
                    raise ValueError(f"returned {len(values)} values for {len(pairs)} completions")
            except Exception as err:  # a criterion must not take training down: 0, with the reason in metrics
                values = [Score(0.0, f"{name} raised {type(err).__name__}: {err}")] * len(pairs)
                metrics[f"pow3r/errors/{name}"] = float(len(pairs))
            out.append([finite(v) or 0.0 for v in values])  # None (not applicable) and non-finite: 0
            if not out[1:]:
                answers = [getattr(v, "answer", None) for v in values]
            if callable(getattr(fn, "step_metrics", None)):
                metrics |= fn.step_metrics()
        return out, answers, metrics

    def score_groups(self, groups: list[RolloutGroup]) -> tuple[list[Score], dict[str, float]]:
        """(r_i = Σ_c ŵ_c·s_{i,c} per rollout, in group order; metrics ``pow3r/weight/<c>``,
        ``pow3r/contrast/<c>``)."""
        s, answers, metrics = self.scores(groups)
        sizes = [len(g.rollouts) for g in groups]
        contrasts = [group_contrast(col, sizes) for col in s]
        cfg = self.cfg
        now = pow3r_weights([c.weight for c in cfg.criteria], contrasts, [c.category for c in cfg.criteria],
                            cfg.floor)
        self.weights = now if self.weights is None else [cfg.ema * p + (1 - cfg.ema) * n
                                                         for p, n in zip(self.weights, now)]
        out = []
        for i in range(sum(sizes)):
            parts = [f"{name} {w:.2f}·{col[i]:g}" for name, w, col in zip(self.names, self.weights, s)]
            out.append(Score(sum(w * col[i] for w, col in zip(self.weights, s)), " + ".join(parts), answers[i]))
        for name, w, c in zip(self.names, self.weights, contrasts):
            metrics |= {f"pow3r/weight/{name}": w, f"pow3r/contrast/{name}": c}
        return out, metrics
