"""``PromptStats``: the running per-prompt statistics every controller reads.

One entry per prompt id that has been drawn (``register``) or rolled out (``observe``):

    index       where the prompt sits in the task's train stream (``train.get(index)``), so a
                selector can draw it again without keeping the Prompt itself
    attempts    rollouts scored so far, over the whole run
    successes   of those, the ones the verifier judged correct (``Rollout.correct``)
    alpha, beta Beta posterior of the pass rate: 1 + successes, 1 + failures, unless a controller
                decays them (VADE: ``visit_decay`` before each update, ``decay_toward_prior``)
    last_step   the training step of the latest observation (-1: drawn, never rolled out)
    mean_length running mean completion length, in tokens
    group_std   population std of the rewards of the prompt's latest group

A long run on an endless prompt stream keeps at most 1.25 × ``capacity`` prompts (the least
recently seen are forgotten first). The store is plain numbers in a dict, so ``state_dict()``
goes into a checkpoint as it is (``controller.pt``) and ``load_state_dict`` restores it: a
resumed run sees the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rollwise.types import RolloutGroup


@dataclass
class PromptRecord:
    index: int = -1
    attempts: int = 0
    successes: int = 0
    alpha: float = 1.0
    beta: float = 1.0
    last_step: int = -1
    mean_length: float = 0.0
    group_std: float = 0.0

    @property
    def pass_rate(self) -> float:
        """Posterior mean of the pass rate, (1 + s) / (2 + n) without decay."""
        return self.alpha / (self.alpha + self.beta)


class PromptStats:
    """Per-prompt running statistics (see the module docstring), keyed by ``Prompt.id``."""

    def __init__(self, visit_decay: float = 1.0, capacity: int = 65_536) -> None:
        self.records: dict[str, PromptRecord] = {}
        self.visit_decay = visit_decay  # (alpha, beta) are multiplied by this before each observation
        self.capacity = capacity  # past 1.25x this many prompts, the least recently seen are forgotten

    def __contains__(self, prompt_id: str) -> bool:
        return prompt_id in self.records

    def __len__(self) -> int:
        return len(self.records)

    def get(self, prompt_id: str) -> PromptRecord:
        """The prompt's record, or a fresh prior (not stored) if it was never seen."""
        return self.records.get(prompt_id) or PromptRecord()

    def register(self, prompt_id: str, index: int) -> PromptRecord:
        """Remember where a drawn prompt lives in the stream (a selector may draw it again)."""
        rec = self.records.setdefault(prompt_id, PromptRecord())
        if index >= 0:
            rec.index = index
        return rec

    def observe(self, group: RolloutGroup, step: int) -> None:
        """Add a scored group's outcomes to its prompt's record. Failed rollouts (``Rollout.failure``:
        a harness or environment that failed) say nothing about the prompt and are left out."""
        live = [r for r in group.rollouts if r.failure is None]
        if not live:
            return
        rec = self.records.setdefault(group.prompt.id, PromptRecord())
        n = len(live)
        s = sum(r.correct for r in live)
        rec.alpha = self.visit_decay * rec.alpha + s
        rec.beta = self.visit_decay * rec.beta + (n - s)
        lengths = [r.num_tokens for r in live]
        rec.mean_length = (rec.mean_length * rec.attempts + sum(lengths)) / (rec.attempts + n)
        rec.attempts += n
        rec.successes += s
        rec.last_step = step
        rewards = group.live_rewards
        mean = sum(rewards) / n
        rec.group_std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / n)
        if len(self.records) > 1.25 * self.capacity:  # a long run on an endless stream stays bounded
            self.forget(self.capacity)

    def decay_toward_prior(self, rate: float) -> None:
        """(alpha, beta) <- 1 + rate * ((alpha, beta) - 1) for every prompt (VADE's per-step decay)."""
        for rec in self.records.values():
            rec.alpha = 1 + rate * (rec.alpha - 1)
            rec.beta = 1 + rate * (rec.beta - 1)

    def seen(self) -> list[str]:
        """Ids of prompts rolled out at least once, oldest observation first (ties: insertion order)."""
        ids = [pid for pid, r in self.records.items() if r.last_step >= 0]
        return sorted(ids, key=lambda pid: self.records[pid].last_step)

    def forget(self, keep: int) -> None:
        """Keep only the ``keep`` most recently observed or drawn prompts (bounds a long run's memory)."""
        if len(self.records) <= keep:
            return
        order = sorted(self.records, key=lambda pid: self.records[pid].last_step)  # stable: older draws first
        for pid in order[: len(self.records) - keep]:
            del self.records[pid]

    def state_dict(self) -> dict:
        return {"records": {pid: asdict(r) for pid, r in self.records.items()}, "visit_decay": self.visit_decay}

    def load_state_dict(self, state: dict) -> None:
        self.records = {pid: PromptRecord(**r) for pid, r in state.get("records", {}).items()}
        self.visit_decay = state.get("visit_decay", self.visit_decay)
