"""``nudge``: every group sampled under K strategy contexts, trained on the bare prompt (NudgeRL,
"Strategy-Guided Exploration for RLVR", 2025).

A prompt x's G rollouts are split over K lightweight strategy contexts c_1..c_K (G/K each; the
remainder to the first contexts): rollout i of context k is sampled from x⊕c_k and stored as a
rollout of x (``prompt_ids`` x's, ``Rollout.context`` = c_k, behaviour log-probs under x⊕c_k), so
the update's importance weight min(π_θ(y|x)/π_old(y|x⊕c_k), 2) carries what the context taught to
the unconditioned policy (``objective.tis_mode: token_truncate`` is filled for this strategy, as
for ``guide``). The advantage decomposes into intra- and inter-context terms plus the distillation
of successful conditioned responses (``optim/nudge.py``; the run config fills
``objective.advantage: nudge`` and ``scale_rewards: none`` for this strategy where the recipe
leaves them unset).

Our choices (METHODS.md ``nudge``): K = 4 contexts (``rollout.nudge.contexts``; an empty string is
the bare prompt), placed by ``rollout.nudge.template``; λ_inter = .5, λ_distill = .1 in the objective.

Where we depart: the paper's contexts are written per task family; ours are three generic
strategy lines plus the bare prompt as the first context (so a group always holds on-policy samples
of x: on a model that cannot use a context — the tiny one — the other contexts' rollouts all fail,
and without it a group would carry no signal); the contexts are fixed, not resampled per step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.engine.protocol import TokenEngine
from rollwise.generate.group import GroupSampler
from rollwise.generate.guide import with_context
from rollwise.types import Prompt, RolloutGroup

# what rollout.strategy=nudge fills in the objective where the recipe leaves it unset (train/config.py FILLS)
NUDGE_OBJECTIVE = {"advantage": "nudge", "scale_rewards": "none"}
# the first is the bare prompt: a group always holds on-policy samples of x (a model that cannot use a context
# still gives a signal there)
CONTEXTS = ["", "Work it out step by step.", "Check every step before the next.", "Start from the simplest part."]


class NudgeConfig(StrictModel):
    """``rollout.strategy: nudge`` options: the strategy contexts and how they join the prompt."""

    contexts: list[str] = Field(CONTEXTS, min_length=1, description="the K strategy contexts a group is split over "
                                "(G/K rollouts each; '' = the bare prompt)")
    template: str = Field("Strategy: {hint}\n{prompt}", description="the conditioned prompt x⊕c, from {hint} (the "
                          "context) and {prompt} (a conversational prompt: its last user message)")


def split(n: int, k: int) -> list[int]:
    """``n`` rollouts over ``k`` contexts: n // k each, the remainder to the first ones.

    >>> split(8, 4), split(6, 4)
    ([2, 2, 2, 2], [2, 2, 1, 1])
    """
    return [n // k + (i < n % k) for i in range(k)]


@dataclass
class NudgeSampler(GroupSampler):
    """Group sampling, each group split over the strategy contexts."""

    nudge: NudgeConfig = field(default_factory=NudgeConfig)
    encode: Callable[[Prompt], list[int]] | None = None  # prompt -> token ids (the trainer's tokenizer)

    def generate(self, engine: TokenEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        contexts = self.nudge.contexts
        cells = []  # (prompt index, context, conditioned prompt, rollouts)
        for pi, (prompt, n) in enumerate(zip(prompts, budgets)):
            for context, k in zip(contexts, split(n, len(contexts))):
                if k:
                    cells.append((pi, context, with_context(prompt, context, self.nudge.template, self.encode), k))
        sampled, metrics = super().generate(engine, [c[2] for c in cells], [c[3] for c in cells], seed)
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        for (pi, context, _, _), cell in zip(cells, sampled):
            for r in cell.rollouts:
                r.prompt_ids = list(prompts[pi].token_ids)  # trained on x: the IS weight corrects x⊕c → x
                r.context = context or None
            groups[pi].rollouts.extend(cell.rollouts)
        return groups, metrics | {"nudge/contexts": float(len(contexts))}
