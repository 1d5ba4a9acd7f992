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

Who writes a rewrite is the trainer's choice (``rewrite``, built by ``tasks/rewrites.py``): the
task's templates (default), or, as in the paper, a model — ``control.clpo.rewriter: model`` with
``control.clpo.judge`` (a local model or an OpenAI-compatible server: the judge interface of
``filter/judge.py``, its backend only) asked to restate or simplify keeping the answer; its tokens
are logged (``control/clpo_rewrite_tokens``). The controller refuses a rewrite whose reference
answer differs from the original's; whether a model's restated text still has that answer is not
checked — the drop rule catches a rewrite it broke only partly.

Where we depart: templates are the default (the demo models cannot be trusted to keep the
answer); templates exist for ``arith`` only; the EMA is kept for the last ``capacity`` prompts
seen. Needs a bigger model and varied tasks to show its effect.
"""

from __future__ import annotations

import dataclasses

from typing import Literal

from pydantic import Field, model_validator

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
    rewriter: Literal["template", "model"] = Field("template", description="template: the task's answer-keeping "
                                                   "templates (arith); model: the judge model writes them (judge)")
    judge: dict | None = Field(None, description="rewriter=model: a judge section (model: {path: ...} or "
                               "base_url/api_model; its rubric and template are not used), checked as the judge reward's")

    @model_validator(mode="after")
    def _model_needs_judge(self):
        if self.rewriter == "model" and self.judge is None:
            raise ValueError("control.clpo.rewriter=model needs control.clpo.judge (judge.model.path=... or "
                             "judge.base_url=...)")
        return self


class Clpo(Controller):
    def __init__(self, cfg: ClpoConfig, seed: int = 0, num_generations: int = 8, rewrite=None) -> None:
        super().__init__(seed=seed, num_generations=num_generations)
        self.cfg = cfg
        # (prompt, kind, shift) -> (rewritten prompt or None, tokens it cost): the task's templates or a model
        # (``tasks/rewrites.py``; the trainer passes it in). None: nothing is rewritten
        self.rewrite = rewrite
        self.accuracy: dict[str, float] = {}  # original prompt id -> accuracy EMA
        self.seen: dict[str, Prompt] = {}  # original prompt id -> the prompt (untokenized fields kept)
        self.counts = {"rewritten": 0, "dropped": 0, "rewrite_tokens": 0}

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
            if self.rewrite is None:
                break
            original = self.seen[pid]
            new, tokens = self.rewrite(original, kind, int(rng.integers(1, 10)))
            self.counts["rewrite_tokens"] += tokens
            if new is not None:
                if new.answer != original.answer:  # a rewrite keeps the reference answer, whoever wrote it
                    raise ValueError(f"clpo: the {kind} rewrite of {original.text!r} changed its answer")
                new = dataclasses.replace(new, id=f"{pid}{REWRITE}{kind}", token_ids=[])
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
               "control/clpo_dropped": float(self.counts["dropped"]),
               "control/clpo_rewrite_tokens": float(self.counts["rewrite_tokens"])}
        for name in ("easy", "medium", "hard"):
            out[f"control/clpo_{name}"] = levels.count(name) / max(len(levels), 1)
        self.counts = {"rewritten": 0, "dropped": 0, "rewrite_tokens": 0}
        return out

    def state_dict(self) -> dict:
        return {"accuracy": dict(self.accuracy), "seen": {k: dataclasses.asdict(p) for k, p in self.seen.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.accuracy = dict(state.get("accuracy", {}))
        self.seen = {k: Prompt(**p) for k, p in state.get("seen", {}).items()}
