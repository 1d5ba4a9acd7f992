"""``guide``: hinted rollouts for the prompts whose whole group failed, trained on the bare prompt.

Guide ("Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models", Nath et al.,
2025; also Agent-RLVR's guidance and XRPO's in-context seeding): sample the group as GRPO does;
where every rollout of a prompt x failed, add guidance h to the context and sample again. The
guided rollouts y ~ π_old(·|x⊕h) are trained as rollouts of x — their stored ``prompt_ids`` are
x's, their behaviour log-probs ℓ^μ those under x⊕h — so the update's importance weight is the
paper's off-policy correction, per token:

    w_t = π_θ(y_t | x, y_<t) / π_old(y_t | x⊕h, y_<t),   truncated at 2,

which is the decoupled PPO form the run gets from ``objective.tis_mode: token_truncate`` (filled for
this strategy where the recipe leaves it unset; a mode that is not a weight is refused): the clipped
ratio π_θ(y|x)/π_prox(y|x) times sg(min(π_prox(y|x)/μ(y|x⊕h), 2)); at the first pass π_prox = π_θ
and the two multiply to w_t.

Our choices (METHODS.md ``guide``): ``num_guided`` = G/2 guided rollouts per failed group;
advantages over the union of the group's failures and its guided rollouts (plain GRPO on the
merged group); a hint from ``rollout.guide.hint`` — the reference answer (``answer``), the task's
demonstration (``demonstration``: a worked solution), or any dataset column — placed into the
prompt by ``rollout.guide.template``. An empty hint leaves x as it is (the extra rollouts are then
on-policy samples of x: weight 1, plain GRPO with more samples); a prompt with no hint is not guided.

Where we depart: a failed group is one with no correct rollout (``Rollout.correct``: score > .5),
not only all-zero rewards; the guided rollouts stay out of the per-prompt pass-rate statistics
(they say nothing about x alone); the paper's PPO variant and its hint schedule are not here — the
hint is fixed text, the same at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pydantic import Field

from rollwise import seeds
from rollwise.config import StrictModel
from rollwise.generate.base import Rounds
from rollwise.generate.group import GroupSampler
from rollwise.types import Prompt, RolloutGroup


class GuideConfig(StrictModel):
    """``rollout.strategy: guide`` options: where the hint comes from, how it joins the prompt, how many."""

    hint: str = Field("answer", description="the hint: answer (the reference answer), demonstration (the task's "
                      "worked solution), or the name of a dataset column")
    template: str = Field("Hint: {hint}\n{prompt}", description="the guided prompt x⊕h, from {hint} and {prompt} "
                          "(a conversational prompt: its last user message)")
    num_guided: int | None = Field(None, ge=1, description="guided rollouts per failed group (null = "
                                   "num_generations / 2, at least 1)")


def failed(group: RolloutGroup) -> bool:
    """No rollout of the group is correct (failed rollouts — ``Rollout.failure`` — aside); an empty group is not."""
    live = [r for r in group.rollouts if r.failure is None]
    return bool(live) and not any(r.correct for r in live)


def hint_for(prompt: Prompt, source: str, demonstrate: Callable[[Prompt], str | None]) -> str | None:
    """The hint ``source`` gives for ``prompt`` (None: it has none, the prompt is not guided)."""
    if source == "answer":
        value = prompt.answer if prompt.answer is not None else prompt.columns.get("answer")
    elif source == "demonstration":
        value = demonstrate(prompt)
    else:
        value = prompt.columns.get(source)
    return None if value is None else str(value)


def with_context(prompt: Prompt, context: str, template: str, encode: Callable[[Prompt], list[int]]) -> Prompt:
    """``prompt`` sampled under ``context``: token ids of the template applied to its text (or its last user
    message); its ``text``, ``id`` and columns stay the bare prompt's, so the rollouts are scored as x's.
    An empty context is the prompt itself."""
    if not context:
        return prompt
    if prompt.messages is not None:
        messages = [dict(m) for m in prompt.messages]
        last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last]["content"] = template.format(hint=context, prompt=messages[last]["content"])
        guided = replace(prompt, messages=messages, token_ids=[])
    else:
        guided = replace(prompt, text=template.format(hint=context, prompt=prompt.text), token_ids=[])
    return replace(prompt, token_ids=encode(guided))


@dataclass
class GuideSampler(GroupSampler):
    """Group sampling; then ``revise`` adds ``num_guided`` hinted rollouts to every group that failed."""

    guide: GuideConfig = field(default_factory=GuideConfig)
    group_size: int = 8  # rollout.num_generations

    @property
    def num_guided(self) -> int:
        return self.guide.num_guided or max(self.group_size // 2, 1)

    def revise(self, groups: list[RolloutGroup], rounds: Rounds) -> dict[str, float]:
        todo = []  # (group, its context)
        for g in groups:
            if failed(g):
                hint = hint_for(g.prompt, self.guide.hint, rounds.demonstrate)
                if hint is not None:
                    todo.append((g, hint))
        metrics = {"guide/failed_groups": float(sum(failed(g) for g in groups)),
                   "guide/guided_groups": float(len(todo))}
        if not todo:
            return metrics | super().revise(groups, rounds) | {"guide/guided_rollouts": 0.0,
                                                               "guide/guided_correct": 0.0, "guide/tokens": 0.0}
        prompts = [with_context(g.prompt, hint, self.guide.template, rounds.encode) for g, hint in todo]
        guided, _, sampled = rounds.sample(prompts, [self.num_guided] * len(prompts), seeds.GUIDED_ROUND,
                                           observe=False)
        n = correct = 0
        for (g, hint), more in zip(todo, guided):
            for r in more.rollouts:
                r.prompt_ids = list(g.prompt.token_ids)  # trained on x: the weight corrects x⊕h → x
                r.context = hint or None  # "": sampled from x itself
                n += 1
                correct += r.correct
            g.rollouts.extend(more.rollouts)
        return metrics | super().revise(groups, rounds) | {"guide/guided_rollouts": float(n),
                                                           "guide/guided_correct": correct / max(n, 1),
                                                           "guide/tokens": float(sampled)}
