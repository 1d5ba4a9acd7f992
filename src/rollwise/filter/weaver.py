"""``weaver``: weak verifiers combined by an EM fit of their accuracies, without labels (Weaver).

Weaver, "Shrinking the Generation-Verification Gap with Weak Verifiers" (Saad-Falcon et al.,
2025): combine weak verifiers (LM judges, reward models), each weighted by an accuracy estimated
by weak supervision without labels, after normalising their outputs and dropping low-quality ones;
the ensemble selects among repeated samples or rewards unlabeled prompts.

The rule (METHODS.md's choices):

- each verifier's outputs are binarised at their median over the fit's items (``binarize``:
  above the median votes 1; a verifier whose values never exceed it — a binary one mostly 1 —
  votes 1 at or above it);
- a two-class latent model (Dawid–Skene) fits the prior P(correct) and each verifier's TPR and
  FPR by EM, the verifiers conditionally independent given the true correctness (``fit_em``;
  started at TPR .7, FPR .3, which picks the labelling in which verifiers beat chance);
- a verifier with TPR − FPR < .05 is dropped and the rest refit;
- the reward is P(correct | votes) (``posterior``).

The fit runs at every scoring call on a window of recent items (``window``, default 4096: the
step's rollouts and those before them; the checkpoint keeps it), so early steps fit on few items. A latent class model
needs 3+ verifiers to be identifiable; fewer is refused. A verifier is any reward by name or a
judge (``name: judge`` with its rubric); None (not applicable) is a missing vote.

Where we depart: the paper normalises verifier scores with dataset statistics and fits a weak
supervision model over many verifiers on held-out-free data, then distils it into a cross-
encoder; ours binarises at the median and fits online on a window, with no distillation. The
default testbed is arith with three rule checks (the answer, the column working, the last number
by math-verify) — near-redundant; Weaver's gains need several genuinely weak, diverse verifiers
(judges of a few billion parameters or served ones).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.judge import JudgeByName, JudgeConfig
from rollwise.filter.rewards import call_reward, finite, load_state, state_of
from rollwise.types import Score

EPS = 1e-4  # rates are kept in [EPS, 1 - EPS]: a perfect verifier would make the posterior 0/0


class VerifierSpec(JudgeByName):
    """One weak verifier: a reward by name, or a judge with its rubric."""

    name: str = Field(description="a reward known to `rollwise list rewards`, 'package.module:function', or judge")
    judge: JudgeConfig | None = Field(None, description="name: judge — the judge and its rubric")


class WeaverConfig(StrictModel):
    """The ensemble (``rewards: [{name: weaver, weaver: {...}}]``)."""

    verifiers: list[VerifierSpec] = Field(
        default_factory=lambda: [VerifierSpec(name=n) for n in ("arith", "arith_working", "math_answer")],
        min_length=3, description="3+ weak verifiers (default: arith's answer, its working, math-verify's answer)")
    min_gap: float = Field(0.05, ge=0, description="drop a verifier whose TPR - FPR is below this")
    window: int = Field(4096, ge=8, description="the fit's items: this many of the latest scored completions")
    iters: int = Field(200, ge=1, description="EM iterations at most")


def binarize(values: np.ndarray) -> np.ndarray:
    """Votes (0/1) from one verifier's values: above the median, or at/above it when nothing is above.

    >>> binarize(np.array([0.1, 0.9, 0.5, 0.7])).tolist(), binarize(np.array([1.0, 1.0, 0.0])).tolist()
    ([0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0])
    """
    finite_values = values[~np.isnan(values)]
    if finite_values.size == 0:
        return np.zeros_like(values)
    t = np.median(finite_values)
    above = values > t
    return (above if above.any() else values >= t).astype(float)


def posterior(votes: np.ndarray, mask: np.ndarray, prior: float, tpr: np.ndarray, fpr: np.ndarray) -> np.ndarray:
    """P(correct | votes) per item under conditional independence; ``mask`` 0 = a missing vote.

    >>> round(float(posterior(np.array([[1., 1.]]), np.ones((1, 2)), .5, np.array([.9, .8]), np.array([.2, .1]))[0]), 4)
    0.973
    """
    log1 = np.log(prior) + (mask * (votes * np.log(tpr) + (1 - votes) * np.log(1 - tpr))).sum(axis=1)
    log0 = np.log(1 - prior) + (mask * (votes * np.log(fpr) + (1 - votes) * np.log(1 - fpr))).sum(axis=1)
    return 1.0 / (1.0 + np.exp(np.clip(log0 - log1, -700, 700)))


def fit_em(votes: np.ndarray, mask: np.ndarray | None = None, iters: int = 200, tol: float = 1e-7
           ) -> tuple[float, np.ndarray, np.ndarray]:
    """(prior, TPR per verifier, FPR per verifier) fitted by EM to ``votes`` [items, verifiers]."""
    mask = np.ones_like(votes) if mask is None else mask
    k = votes.shape[1]
    prior, tpr, fpr = 0.5, np.full(k, 0.7), np.full(k, 0.3)
    for _ in range(iters):
        q = posterior(votes, mask, prior, tpr, fpr)[:, None]  # [items, 1]
        new_prior = float(np.clip(q.mean(), EPS, 1 - EPS))
        new_tpr = np.clip((q * mask * votes).sum(0) / np.maximum((q * mask).sum(0), EPS), EPS, 1 - EPS)
        new_fpr = np.clip(((1 - q) * mask * votes).sum(0) / np.maximum(((1 - q) * mask).sum(0), EPS), EPS, 1 - EPS)
        change = max(abs(new_prior - prior), np.abs(new_tpr - tpr).max(), np.abs(new_fpr - fpr).max())
        prior, tpr, fpr = new_prior, new_tpr, new_fpr
        if change < tol:
            break
    return prior, tpr, fpr


def fit_and_drop(votes: np.ndarray, mask: np.ndarray, min_gap: float, iters: int = 200):
    """(kept verifier indices, prior, TPR, FPR of the kept): fit, drop those with TPR − FPR < min_gap, refit."""
    kept = np.arange(votes.shape[1])
    prior, tpr, fpr = fit_em(votes, mask, iters)
    while kept.size and (tpr - fpr < min_gap).any():
        keep = tpr - fpr >= min_gap
        kept = kept[keep]
        if kept.size == 0:
            break
        prior, tpr, fpr = fit_em(votes[:, kept], mask[:, kept], iters)
    return kept, prior, tpr, fpr


class Weaver:
    """Weaver: weak verifiers (rewards or judges), each binarised at its median, combined as
    P(correct | votes) with TPR/FPR fitted by EM without labels; a verifier no better than chance is dropped."""

    __name__ = "weaver"

    def __init__(self, cfg: WeaverConfig, verifiers: list[tuple[str, Callable]]):
        if len(verifiers) < 3:
            raise ConfigError("weaver.verifiers: a latent-class fit needs 3 or more verifiers to be identifiable")
        self.cfg, self.names = cfg, [name for name, _ in verifiers]
        self.fns = [fn for _, fn in verifiers]
        self.verifier_name = self.names[0]  # its first verifier is the eval judge's check
        self.history: deque = deque(maxlen=cfg.window)  # raw value rows of the latest items (NaN = no vote)
        self.metrics: dict[str, float] = {}

    def state_dict(self) -> dict:
        """The window of latest value rows the fit runs on and the verifiers' own state, for the checkpoint."""
        return {"history": list(self.history), "verifiers": [state_of(fn) for fn in self.fns]}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque(state.get("history", []), maxlen=self.cfg.window)
        for fn, sub in zip(self.fns, state.get("verifiers", [])):
            load_state(fn, sub)

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[Score]:
        raw, answers = self.values(prompts, completions, completion_ids, columns)
        self.history.extend(raw.tolist())
        window = np.array(self.history)
        mask = (~np.isnan(window)).astype(float)
        votes = np.stack([binarize(window[:, j]) for j in range(window.shape[1])], axis=1)
        kept, prior, tpr, fpr = fit_and_drop(votes, mask, self.cfg.min_gap, self.cfg.iters)
        now = slice(len(window) - len(raw), len(window))
        if kept.size:
            scores = posterior(votes[now][:, kept], mask[now][:, kept], prior, tpr, fpr)
        else:  # no verifier beats chance: no signal (every rollout the prior)
            scores = np.full(len(raw), prior)
        self.record(kept, prior, tpr, fpr, len(window))
        return [Score(float(s), "P(correct | votes " + "".join(str(int(v)) for v in votes[now][i]) + f") = {s:.3f}",
                      answers[i]) for i, s in enumerate(scores)]

    def values(self, prompts, completions, completion_ids, columns) -> tuple[np.ndarray, list]:
        """[items, verifiers] raw values (NaN: None, non-finite, or the verifier raised) and the first one's answers."""
        kwargs = {**columns, "completion_ids": completion_ids}
        cols, answers = [], [None] * len(completions)
        for j, fn in enumerate(self.fns):
            try:
                vals = call_reward(fn, prompts, completions, kwargs)
                if len(vals) != len(completions):
                    raise ValueError(f"returned {len(vals)} values for {len(completions)} completions")
            except Exception:  # a weak verifier that fails casts no vote
                vals = [None] * len(completions)
            cols.append([np.nan if finite(v) is None else finite(v) for v in vals])
            if j == 0:
                answers = [getattr(v, "answer", None) for v in vals]
            if callable(getattr(fn, "step_metrics", None)):
                self.metrics |= fn.step_metrics()
        return np.array(cols, dtype=float).T, answers

    def record(self, kept, prior, tpr, fpr, items: int) -> None:
        self.metrics |= {"weaver/prior": prior, "weaver/items": float(items),
                         "weaver/kept": float(len(kept))}
        for j, name in enumerate(self.names):
            where = np.nonzero(kept == j)[0]
            if where.size:
                self.metrics |= {f"weaver/tpr/{name}": float(tpr[where[0]]), f"weaver/fpr/{name}": float(fpr[where[0]])}

    def step_metrics(self) -> dict[str, float]:
        """The latest fit (``weaver/prior``, ``weaver/tpr/<v>``, ``weaver/fpr/<v>``, ``weaver/kept``) and the
        verifiers' own (a judge's tokens)."""
        out, self.metrics = self.metrics, {}
        return out
