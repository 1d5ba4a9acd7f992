"""``clpo``: an online curriculum that rewrites medium and hard prompts from the policy's own accuracy.

CLPO, "Curriculum Learning meets Policy Optimization" (2025): the model's rollout accuracy on each
problem sorts it into a difficulty; within the loop, medium problems are *diversified* (restated)
and hard ones *simplified*, and the rewrites are trained alongside fresh problems.

The rule (METHODS.md's choice): every prompt seen keeps an accuracy EMA (its groups' mean
correctness, weight ``ema`` on the newest); easy ≥ .8, hard ≤ .2, medium in between. Each step
``rewrite_share`` of the prompts are rewrites of seen non-easy prompts (the rest fresh): a medium
one is diversified, a hard one simplified. Rewrites are templates through the task's generator
parameters and keep the reference answer: for ``arith`` (columns a, op, b) diversifying restates
the same sum — a+b as b+a, a·b as b·a, a−b as (a+k)−(b+k) — and simplifying only *adds a given*,
the first column of the working written after the prompt (the model continues from it). A rewrite
whose first ``check_samples`` (4) rollouts all pass or all fail is dropped (``accept``: no signal
at that difficulty). An easy prompt is never rewritten; a prompt without a template (other tasks,
``*`` products for simplifying) is left as it is.

Where we depart: the paper's model writes the rewrites; here templates do (the judge interface,
``filter/judge.py``, could write them — not wired: a model-written rewrite needs a model that
keeps the answer, which the demo models do not). Templates exist for ``arith`` only; the EMA is
kept for prompts of the last ``capacity`` seen. Needs a bigger model and varied tasks to show its
effect.
"""

from __future__ import annotations

import dataclasses

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, PromptCursor
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup, is_correct

REWRITE = "~clpo-"  # a rewrite's prompt id: <original id>~clpo-<kind>


class ClpoConfig(StrictModel):
    easy: float = Field(0.8, ge=0, le=1, description="accuracy EMA at or above which a prompt is easy (never rewritten)")
    hard: float = Field(0.2, ge=0, le=1, description="accuracy EMA at or below which a prompt is hard (simplified)")
    ema: float = Field(0.5, gt=0, le=1, description="weight of a group's accuracy in the prompt's EMA")
    rewrite_share: float = Field(0.25, ge=0, le=1, description="share of each step's prompts that are rewrites")
    check_samples: int = Field(4, ge=2, description="a rewrite whose first n rollouts all pass or all fail is dropped")
    capacity: int = Field(4096, ge=1, description="seen prompts kept with their EMA")


def arith_rewrite(prompt: Prompt, kind: str, shift: int) -> Prompt | None:
    """The ``arith`` rewrite of ``prompt`` (``diversify`` or ``simplify``), or None when there is none.

    >>> from rollwise.tasks.arith import make_prompt
    >>> p = make_prompt("p", 347, "+", 58)
    >>> [(q.text, q.answer) for q in (arith_rewrite(p, "diversify", 3), arith_rewrite(p, "simplify", 3))]
    [('58+347=', '405'), ('347+58= 7+8+0=15', '405')]
    """
    from rollwise.filter.arith import solve
    from rollwise.tasks.arith import make_prompt

    c = prompt.columns or {}
    if not {"a", "op", "b"} <= set(c):
        return None
    a, op, b = c["a"], c["op"], c["b"]
    if kind == "diversify":
        new = make_prompt(prompt.id, *((b, op, a) if op in "+*" else (a + shift, op, b + shift)))
    else:
        steps = solve(a, op, b).rsplit("#", 1)[0].split()
        if len(steps) < 2:  # no working (a product) or one column: nothing to give
            return None
        new = make_prompt(prompt.id, a, op, b)
        new = dataclasses.replace(new, text=f"{new.text} {steps[0]}")
    if new.answer != prompt.answer:  # a template that changes the answer is a bug, not a rewrite
        raise AssertionError(f"clpo: the {kind} rewrite of {prompt.text!r} changed the answer")
    return dataclasses.replace(new, id=f"{prompt.id}{REWRITE}{kind}", token_ids=[])


class Clpo(Controller):
    def __init__(self, cfg: ClpoConfig, seed: int = 0, num_generations: int = 8) -> None:
        super().__init__(seed=seed, num_generations=num_generations)
        self.cfg = cfg
        self.accuracy: dict[str, float] = {}  # original prompt id -> accuracy EMA
        self.seen: dict[str, Prompt] = {}  # original prompt id -> the prompt (untokenized fields kept)
        self.counts = {"rewritten": 0, "dropped": 0}

    def level(self, prompt_id: str) -> str | None:
        a = self.accuracy.get(prompt_id)
        return None if a is None else "easy" if a >= self.cfg.easy else "hard" if a <= self.cfg.hard else "medium"

    def rewrites(self, k: int, prepare) -> list[Prompt]:
        """Up to ``k`` rewrites of seen medium/hard prompts, drawn by the step's generator."""
        candidates = [pid for pid in self.seen if self.level(pid) in ("medium", "hard")]
        rng = self.rng(salt=7)
        out = []
        for i in rng.permutation(len(candidates)).tolist():
            if len(out) >= k:
                break
            pid = candidates[i]
            kind = "simplify" if self.level(pid) == "hard" else "diversify"
            new = arith_rewrite(self.seen[pid], kind, shift=int(rng.integers(1, 10)))
            if new is not None:
                out.append(prepare(new) if prepare is not None else new)
        return out

    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        rewritten = self.rewrites(round(n * self.cfg.rewrite_share), source.prepare)
        self.counts["rewritten"] += len(rewritten)
        return source.fresh(n - len(rewritten), stats) + rewritten

    def accept(self, group: RolloutGroup) -> bool:
        if REWRITE not in group.prompt.id:
            return True
        first = [is_correct(r.reward if r.score is None else r.score) for r in group.rollouts[: self.cfg.check_samples]]
        if len(set(first)) == 1:
            self.counts["dropped"] += 1
            return False
        return True

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        for g in groups:
            pid = g.prompt.id
            if REWRITE in pid or not g.rollouts:
                continue
            acc = sum(r.correct for r in g.rollouts) / len(g.rollouts)
            old = self.accuracy.get(pid)
            self.accuracy[pid] = acc if old is None else (1 - self.cfg.ema) * old + self.cfg.ema * acc
            self.seen.pop(pid, None)
            self.seen[pid] = g.prompt  # most recent last
        while len(self.seen) > self.cfg.capacity:  # the least recently seen go first
            pid = next(iter(self.seen))
            del self.seen[pid]
            self.accuracy.pop(pid, None)

    def metrics(self) -> dict[str, float]:
        levels = [self.level(pid) for pid in self.seen]
        out = {"control/clpo_rewritten": float(self.counts["rewritten"]),
               "control/clpo_dropped": float(self.counts["dropped"])}
        for name in ("easy", "medium", "hard"):
            out[f"control/clpo_{name}"] = levels.count(name) / max(len(levels), 1)
        self.counts = {"rewritten": 0, "dropped": 0}
        return out

    def state_dict(self) -> dict:
        return {"accuracy": dict(self.accuracy), "seen": {k: dataclasses.asdict(p) for k, p in self.seen.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.accuracy = dict(state.get("accuracy", {}))
        self.seen = {k: Prompt(**p) for k, p in state.get("seen", {}).items()}
