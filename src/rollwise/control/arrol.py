"""``arrol``: "Prune as You Generate: Online Rollout Pruning for Faster and Better RLVR" (ARRoL, 2025).

A small quality head, trained online on the policy's own hidden states, predicts from a
partial rollout whether it will be correct. Generation starts 2G rollouts per prompt
(``generate/pruned.py``); once every rollout of a prompt has sampled ``segment_len`` tokens
(or finished), ``prune_at`` (¼) of the length budget ``rollout.max_new_tokens``, the head
scores them and the prompt keeps the ⌈G/2⌉ most and the ⌊G/2⌋ least likely to succeed
(``balanced_keep``) — survivors balanced between correct and incorrect, the group that
carries most signal — and the engine aborts the rest (``SlotEngine.abort``;
``engine.stats.aborted_tokens``). Pruned rollouts leave no tokens behind.

The head is a logistic probe on the final hidden state (the normed state the LM head reads)
at the pruning point, trained with BCE on the scored rollouts of recent steps (a buffer of
``buffer`` examples; every 5th held out). Pruning starts only once the held-out AUC exceeds
``min_auc`` (.6); until then each prompt samples just G and nothing is pruned.

Departures from the paper:
- One pruning point per prompt, at ``prune_at`` × ``rollout.max_new_tokens`` tokens (the paper
  prunes every 512 tokens of long reasoning traces). It scales with the length budget, so on a
  short task the pruned rollouts stop early enough to save tokens (a fixed 8 tokens was past
  the end of most completions of an 8–16-token task: everything finished, nothing was saved).
- Rollouts that finish before the pruning point take part in the choice with their last
  hidden state; pruned finished rollouts are dropped (their tokens were sampled: wasted).
- The head learns only from survivors (pruned rollouts have no label).
- No test-time weighting of candidates by the head.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller
from rollwise.control.stats import PromptStats
from rollwise.types import RolloutGroup


class ArrolConfig(StrictModel):
    over_provision: int = Field(2, ge=1, description="rollouts started per kept rollout while pruning (2G for G)")
    prune_at: float = Field(0.25, gt=0, le=1, description="prune after this fraction of rollout.max_new_tokens")
    min_auc: float = Field(0.6, ge=0.5, le=1, description="prune only once the probe's held-out AUC exceeds this")
    min_examples: int = Field(64, ge=10, description="scored rollouts the probe needs before its AUC counts")
    buffer: int = Field(4096, ge=10, description="recent (hidden state, correct) examples the probe trains on")
    probe_steps: int = Field(100, ge=1, description="Adam steps per refit of the probe")
    probe_lr: float = Field(0.05, gt=0, description="probe learning rate")


def pruning_point(prune_at: float, max_new_tokens: int) -> int:
    """Tokens sampled before a prompt's rollouts are pruned: ``prune_at`` of the length budget, at least 1.

    >>> pruning_point(0.25, 32), pruning_point(0.25, 8), pruning_point(0.25, 4096)
    (8, 2, 1024)
    """
    return max(1, round(prune_at * max_new_tokens))


def balanced_keep(p: list[float], g: int) -> list[int]:
    """Indices of the ⌈g/2⌉ highest and ⌊g/2⌋ lowest ``p`` (ties to the lower index), in index order.

    >>> balanced_keep([.9, .8, .7, .6, .4, .3, .2, .1], 4)
    [0, 1, 6, 7]
    """
    if g >= len(p):
        return list(range(len(p)))
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    top = order[: math.ceil(g / 2)]
    rest = [i for i in order if i not in top]
    bottom = sorted(rest, key=lambda i: (p[i], i))[: g // 2]
    return sorted(top + bottom)


def auc(scores: list[float], labels: list[bool]) -> float:
    """Area under the ROC curve (ties count half); .5 when one class is missing.

    >>> auc([.9, .8, .3, .1], [True, False, True, False])
    0.75
    """
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return 0.5
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


class Arrol(Controller):
    name = "arrol"
    prunes_in_generation = True  # the trainer generates with generate/pruned.py, this controller as its pruner

    def __init__(self, cfg: ArrolConfig, max_new_tokens: int = 128, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        # read by generate/pruned.py; max_new_tokens is rollout.max_new_tokens (build_controller passes it)
        self.over_provision, self.segment_len = cfg.over_provision, pruning_point(cfg.prune_at, max_new_tokens)
        self.features: dict[int, torch.Tensor] = {}  # the generator's: id(rollout) -> hidden state [D]
        self.x: torch.Tensor | None = None  # [N, D] buffer of examples
        self.y: torch.Tensor | None = None  # [N] 1 = correct
        self.w: torch.Tensor | None = None  # [D]
        self.b = torch.zeros(())
        self.held_out_auc = 0.5
        self._kept: list[float] = []

    # the pruner protocol of generate/pruned.py ------------------------------------------------
    def ready(self) -> bool:
        return self.w is not None and self.held_out_auc > self.cfg.min_auc

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(features.float() @ self.w + self.b)

    def keep(self, features: torch.Tensor, budget: int) -> list[int]:
        p = self.predict(features).tolist()
        kept = balanced_keep(p, budget)
        self._kept += [p[i] for i in kept]
        return kept

    # learning the probe ------------------------------------------------------------------------
    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        xs, ys = [], []
        for g in groups:
            for r in g.rollouts:
                f = self.features.get(id(r))
                if f is not None:
                    xs.append(f.float())
                    ys.append(float(r.correct))
        if not xs:
            return
        x, y = torch.stack(xs), torch.tensor(ys)
        self.x = x if self.x is None else torch.cat([self.x, x])[-self.cfg.buffer:]
        self.y = y if self.y is None else torch.cat([self.y, y])[-self.cfg.buffer:]
        self.fit()

    def fit(self) -> None:
        """Refit the probe on the buffer (every 5th example held out) and measure its held-out AUC."""
        n = len(self.y)
        held = torch.arange(n) % 5 == 4
        if n < self.cfg.min_examples:
            return
        x, y = self.x[~held], self.y[~held]
        mean = x.mean(0)
        w = torch.zeros(x.shape[1], requires_grad=True)
        b = torch.zeros((), requires_grad=True)
        opt = torch.optim.Adam([w, b], lr=self.cfg.probe_lr)
        for _ in range(self.cfg.probe_steps):
            opt.zero_grad()
            logits = (x - mean) @ w + b
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + 1e-3 * w.pow(2).sum()
            loss.backward()
            opt.step()
        self.w, self.b = w.detach(), (b - mean @ w).detach()
        scores = self.predict(self.x[held]).tolist()
        self.held_out_auc = auc(scores, [bool(v) for v in self.y[held].tolist()])

    def metrics(self) -> dict[str, float]:
        kept, self._kept = self._kept, []
        out = {"control/probe_auc": self.held_out_auc,
               "control/probe_examples": float(0 if self.y is None else len(self.y))}
        if kept:
            out["control/kept_p_mean"] = sum(kept) / len(kept)
        return out

    def state_dict(self) -> dict:
        return {"x": self.x, "y": self.y, "w": self.w, "b": self.b, "held_out_auc": self.held_out_auc}

    def load_state_dict(self, state: dict) -> None:
        self.x, self.y, self.w, self.b = state["x"], state["y"], state["w"], state["b"]
        self.held_out_auc = state["held_out_auc"]
