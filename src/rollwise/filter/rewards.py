"""Scoring rollouts with TRL-style reward functions, weighted and logged per component.

A reward function is called as TRL calls it::

    fn(prompts, completions, completion_ids=completion_ids, **dataset_columns) -> list[float | None]

and may be ``async``. ``None`` means "not applicable" and contributes nothing (it is not a
zero). A function may return ``rollwise.types.Score`` values (floats that carry a
``reason`` and, for verifiers that extract one, the final ``answer``); the reason is recorded
on the rollout, and the first function's extracted answer becomes ``Rollout.extracted_answer``
(what maj@k votes with). A function that raises does not crash
training: every rollout of that call scores 0 for that component, the reason says why, and
``reward/<name>/errors`` counts it.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from rollwise.config import ConfigError
from rollwise.types import RolloutGroup, Score

log = logging.getLogger(__name__)
ENV_REWARD = "environment"  # the component an environment's get_reward() fills (multi-turn episodes)


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float = 1.0


def as_text(completion) -> str:
    """A completion as text, whether plain or TRL-conversational (``[{"role", "content"}, ...]``)."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def load_callable(spec: str) -> Callable:
    """``"package.module:function"`` → the function (how users bring their own rewards)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"reward function '{spec}' must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"reward function '{spec}': cannot import module '{module_name}' ({err})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"reward function '{spec}': module '{module_name}' has no callable '{attr}'")
    return fn


def _call(fn: Callable, prompts, completions, completion_ids, columns) -> list:
    result = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return list(result)


async def _await(awaitable):
    return await awaitable


def score_groups(groups: list[RolloutGroup], reward_fns: list[RewardFn]) -> dict[str, float]:
    """Set ``reward``, ``reward_components``, ``reward_reasons`` and ``extracted_answer`` on every rollout.

    The total is the weighted sum of the components that apply (non-None). Returns metrics:
    the mean of each component over rollouts where it applied, and error counts.
    """
    rollouts = [(g, r) for g in groups for r in g.rollouts]
    # TRL's formats: conversational prompts get message lists on both sides, others plain text
    prompts = [g.prompt.messages if g.prompt.messages is not None else g.prompt.text for g, _ in rollouts]
    # a multi-turn episode of a conversational prompt: its whole conversation (assistant turns and tool
    # messages); of a plain prompt: its text, inserted results included
    completions = [
        (r.messages or [{"role": "assistant", "content": r.completion_text}]) if g.prompt.messages is not None
        else r.completion_text
        for g, r in rollouts
    ]
    completion_ids = [r.completion_ids for _, r in rollouts]
    per_rollout = [g.prompt.reward_columns() for g, _ in rollouts]
    keys = sorted({k for cols in per_rollout for k in cols})
    columns = {k: [cols.get(k) for cols in per_rollout] for k in keys}
    metrics: dict[str, float] = {}
    totals = [0.0] * len(rollouts)
    answers: list[str | None] = [None] * len(rollouts)  # the first reward function's extracted answer wins
    for rf in reward_fns:
        try:
            values = _call(rf.fn, prompts, completions, completion_ids, columns)
            if len(values) != len(rollouts):
                raise ValueError(f"returned {len(values)} values for {len(rollouts)} completions")
            errors = 0
        except Exception as err:  # a reward function must not take training down
            log.warning("reward function '%s' raised %s: %s; scoring this batch 0", rf.name, type(err).__name__, err)
            values = [Score(0.0, f"{rf.name} raised {type(err).__name__}: {err}")] * len(rollouts)
            errors = len(rollouts)
        for i, ((_, r), v) in enumerate(zip(rollouts, values)):
            if v is None:
                continue
            value = float(v)
            if math.isnan(value):
                value, reason = 0.0, "reward was NaN"
            else:
                reason = getattr(v, "reason", "")
            r.reward_components[rf.name] = value
            if reason:
                r.reward_reasons[rf.name] = reason
            if answers[i] is None and isinstance(getattr(v, "answer", None), str):
                answers[i] = v.answer
            totals[i] += rf.weight * value
        metrics[f"reward/{rf.name}/errors"] = float(errors)
    for i, (_, r) in enumerate(rollouts):  # an environment that scores its episodes: one more component, weight 1
        if r.env_reward is not None:
            r.reward_components[ENV_REWARD] = r.env_reward
            totals[i] += r.env_reward
    for (_, r), total, answer in zip(rollouts, totals, answers):
        if r.failure is not None:  # it could not be scored (a harness that raised or hung): 0, with the reason
            total = 0.0
            r.reward_reasons["failure"] = r.failure
        r.score = r.reward = total  # the verdict; shaping terms later add to ``reward`` only
        r.extracted_answer = answer
    return component_means(groups) | metrics


def component_means(groups: list[RolloutGroup]) -> dict[str, float]:
    """``reward/<name>``: the mean of each reward component over the rollouts it applied to
    (what ``score_groups`` reports; recomputed from the rollouts when shards were scored apart)."""
    values: dict[str, list[float]] = {}
    for g in groups:
        for r in g.rollouts:
            for name, v in r.reward_components.items():
                values.setdefault(name, []).append(v)
    return {f"reward/{name}": sum(v) / len(v) for name, v in values.items()}

