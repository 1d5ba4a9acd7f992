"""Scoring rollouts with TRL-style reward functions, weighted and logged per component.

A reward function is called as TRL calls it::

    fn(prompts, completions, completion_ids=completion_ids, completion_messages=..., **dataset_columns)
        -> list[float | None]

and may be ``async``. ``completions`` is what the model answered: the final assistant turn (the
last assistant message of a multi-turn episode, never the tool output before it), as text for a
plain prompt and as TRL's ``[{"role": "assistant", "content": ...}]`` for a conversational one;
``completion_messages`` is each rollout's whole episode as messages (assistant turns and tool
results; None for a single completion). The same holds for in-process episodes and harness
episodes (through the endpoint). ``None`` means "not applicable" and contributes nothing (it is not a
zero). A function may return ``rollwise.types.Score`` values (floats that carry a
``reason`` and, for verifiers that extract one, the final ``answer``); the reason is recorded
on the rollout, and the first function's extracted answer becomes ``Rollout.extracted_answer``
(what maj@k votes with). A function that raises does not crash
training: every rollout of that call scores 0 for that component, the reason says why
(``<name> raised <Error>: ...``), ``reward/<name>/errors`` counts it, and the first failure of
each function is logged once. ``reward_failures`` totals both kinds per function from the
recorded reasons (the run's ``summary.json`` and closing lines report them). A value whose reason
starts ``<name> could not score:`` (a ``judge`` reply with no score, a failed judge request) is
counted as an error the same way. A function with a ``step_metrics()`` method (the judge) adds
what it returns to the step's metrics after each call (``judge/tokens``...).

A value that is not a finite number (NaN, ±inf, or not a number at all) from a reward
function, an environment's ``get_reward()``, an OpenEnv server or a harness's return scores 0
for that component with the reason ``non-finite``, counted by ``reward/<name>/non_finite``: a
non-finite reward never reaches an advantage. A rollout with ``failure`` set (its harness
raised or timed out, its environment failed) scores 0 with that reason; the optimizer gives
it no weight (``rollwise.optim``).

A reward with a ``score_groups(groups) -> (values, metrics)`` method (``majority_vote``) is
given the whole groups instead of TRL's flat call; its metrics join the step's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rollwise.config import ConfigError
from rollwise.types import Rollout, RolloutGroup, Score

log = logging.getLogger(__name__)
ENV_REWARD = "environment"  # the component an environment's get_reward() fills (multi-turn episodes)
RAISED = " raised "  # a component's reason "<name> raised <Error>: ..." : its function failed (raised, wrong length)
NON_FINITE = "non-finite"  # a component's reason "non-finite (<value>)": the value was not a finite number
UNSCORED = " could not score: "  # a component's reason "<name> could not score: ...": a judge gave no score (a failure)


@dataclass
class RewardFn:
    name: str
    fn: Callable
    weight: float = 1.0
    warned: bool = field(default=False, repr=False, compare=False)  # its first failure was logged (once per run)


def as_text(completion) -> str:
    """A completion as text, whether plain or TRL-conversational (``[{"role", "content"}, ...]``)."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def load_callable(spec: str, key: str = "reward function") -> Callable:
    """``"package.module:function"`` → the function (how users bring their own rewards), imported by
    ``rollwise.imports``' rule (the working directory and the recipe's directory are importable);
    ``key`` is the config key that names it, for errors."""
    from rollwise.imports import import_spec

    fn = import_spec(spec, key, what="callable")
    if not callable(fn):
        module_name, _, attr = spec.partition(":")
        raise ConfigError(f"{key}: '{spec}': '{attr}' in module '{module_name}' is not callable")
    return fn


def _call(fn: Callable, prompts, completions, completion_ids, columns) -> list:
    result = fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return list(result)


async def _await(awaitable):
    return await awaitable


def call_reward(fn: Callable, prompts, completions, kwargs: dict) -> list:
    """``fn`` called as TRL calls it, on ``reward_inputs``' output (awaited if async); may raise."""
    columns = {k: v for k, v in kwargs.items() if k != "completion_ids"}
    return _call(fn, prompts, completions, kwargs["completion_ids"], columns)


def final_turn(rollout: Rollout) -> str:
    """What the model answered: the last assistant message of an episode (``Rollout.messages``),
    else the whole completion (a single completion is its own final turn).

    >>> r = Rollout("p", [1], [], [], [], "stop", completion_text="call 6*7 <result>42</result> it is 41",
    ...             messages=[{"role": "assistant", "content": "call 6*7"}, {"role": "tool", "content": "42"},
    ...                       {"role": "assistant", "content": "it is 41"}])
    >>> final_turn(r)
    'it is 41'
    """
    for m in reversed(rollout.messages or []):
        if isinstance(m, dict) and m.get("role") == "assistant":
            return str(m.get("content") or "")
    return rollout.completion_text


def finite(value) -> float | None:
    """``value`` as a finite float, or None (NaN, ±inf, or not a number at all).

    >>> finite(Score(1.0)), finite(float("inf")), finite("nan"), finite(object())
    (1.0, None, None, None)
    """
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def reward_inputs(rollouts: list[tuple[RolloutGroup, Rollout]]) -> tuple[list, list, dict]:
    """(prompts, completions, keyword arguments) for TRL-style reward functions, in TRL's formats:
    conversational prompts get message lists on both sides, others plain text. ``completions`` is
    the final assistant turn (``final_turn``); ``completion_messages`` the whole episode."""
    conversational = [g.prompt.messages is not None for g, _ in rollouts]
    prompts = [g.prompt.messages if conv else g.prompt.text for conv, (g, _) in zip(conversational, rollouts)]
    completions = [[{"role": "assistant", "content": final_turn(r)}] if conv else final_turn(r)
                   for conv, (_, r) in zip(conversational, rollouts)]
    per_rollout = [g.prompt.reward_columns() for g, _ in rollouts]
    keys = sorted({k for cols in per_rollout for k in cols})
    kwargs = {k: [cols.get(k) for cols in per_rollout] for k in keys}
    kwargs["completion_ids"] = [r.completion_ids for _, r in rollouts]
    kwargs["completion_messages"] = [r.messages for _, r in rollouts]
    return prompts, completions, kwargs


def _values(rf: RewardFn, prompts, completions, kwargs, n: int) -> tuple[list, int]:
    """One reward function's values for ``n`` rollouts, and how many it failed (all, if it raised)."""
    try:
        values = _call(rf.fn, prompts, completions, kwargs.pop("completion_ids"), kwargs)
        if len(values) != n:
            raise ValueError(f"returned {len(values)} values for {n} completions")
        return values, 0
    except Exception as err:  # a reward function must not take training down
        if not rf.warned:  # once: every later failure is counted (reward/<name>/errors, summary.json)
            rf.warned = True
            log.warning("reward function '%s' raised %s: %s; its rollouts score 0 for it (each failure is counted "
                        "in reward/%s/errors and summary.json's reward_failures)", rf.name, type(err).__name__, err,
                        rf.name)
        return [Score(0.0, f"{rf.name}{RAISED}{type(err).__name__}: {err}")] * n, n


def _group_values(rf: RewardFn, groups: list[RolloutGroup], n: int) -> tuple[list, int, dict]:
    """A group-level reward's values (``rf.fn.score_groups(groups) -> (values, metrics)``: majority_vote
    reads whole groups), failures as ``_values`` counts them, and its metrics."""
    try:
        values, metrics = rf.fn.score_groups(groups)
        if len(values) != n:
            raise ValueError(f"returned {len(values)} values for {n} completions")
        return list(values), 0, metrics
    except Exception as err:  # as _values: a reward must not take training down
        if not rf.warned:
            rf.warned = True
            log.warning("reward '%s' raised %s: %s; its rollouts score 0 for it", rf.name, type(err).__name__, err)
        return [Score(0.0, f"{rf.name}{RAISED}{type(err).__name__}: {err}")] * n, n, {}


def _component(r: Rollout, name: str, v) -> float:
    """Record component ``name`` = ``v`` on ``r`` (0 with the reason ``non-finite`` for a value that
    is not a finite number); returns the value recorded."""
    value = finite(v)
    if value is None:
        value, reason = 0.0, f"{NON_FINITE} ({v!r:.40})"
    else:
        reason = getattr(v, "reason", "")
    r.reward_components[name] = value
    if reason:
        r.reward_reasons[name] = reason
    return value


def state_of(fn) -> dict | None:
    """What a reward function carries from one scoring call to the next (POW3R's smoothed weights,
    Weaver's window, a judge's cache), for the checkpoint; None when it carries nothing."""
    get = getattr(fn, "state_dict", None)
    return get() if callable(get) else None


def load_state(fn, state: dict | None) -> None:
    """Give ``fn`` back the state ``state_of`` took (nothing to give: nothing done)."""
    if state is not None and callable(getattr(fn, "load_state_dict", None)):
        fn.load_state_dict(state)


def score_groups(groups: list[RolloutGroup], reward_fns: list[RewardFn]) -> dict[str, float]:
    """Set ``reward``, ``reward_components``, ``reward_reasons`` and ``extracted_answer`` on every rollout.

    The total is the weighted sum of the components that apply (non-None), each finite (a
    non-finite one scores 0, reason ``non-finite``). Returns metrics: the mean of each
    component over rollouts where it applied, error and non-finite counts.
    """
    rollouts = [(g, r) for g in groups for r in g.rollouts]
    prompts, completions, kwargs = reward_inputs(rollouts)
    metrics: dict[str, float] = {}
    totals = [0.0] * len(rollouts)
    answers: list[str | None] = [None] * len(rollouts)  # the first reward function's extracted answer wins
    for rf in reward_fns:
        if callable(getattr(rf.fn, "score_groups", None)):  # a group-level reward (majority_vote)
            values, errors, extra = _group_values(rf, groups, len(rollouts))
            metrics |= extra
        else:
            values, errors = _values(rf, prompts, completions, dict(kwargs), len(rollouts))
        bad = 0
        for i, ((_, r), v) in enumerate(zip(rollouts, values)):
            if v is None:
                continue
            bad += finite(v) is None
            errors += str(getattr(v, "reason", "")).startswith(rf.name + UNSCORED)
            totals[i] += rf.weight * _component(r, rf.name, v)
            if answers[i] is None and isinstance(getattr(v, "answer", None), str):
                answers[i] = v.answer
        if bad and not rf.warned:
            rf.warned = True
            log.warning("reward function '%s' returned %d values that are not finite numbers; they score 0 (each "
                        "is counted in reward/%s/non_finite and summary.json's reward_failures)", rf.name, bad, rf.name)
        metrics[f"reward/{rf.name}/errors"] = float(errors)
        metrics[f"reward/{rf.name}/non_finite"] = float(bad)
        if callable(getattr(rf.fn, "step_metrics", None)):  # the judge: its tokens and requests (the run's cost)
            metrics |= rf.fn.step_metrics()
    bad = 0
    for i, (_, r) in enumerate(rollouts):  # an environment that scores its episodes: one more component, weight 1
        if r.env_reward is not None:  # get_reward(), an OpenEnv server's reward, a harness's return
            bad += finite(r.env_reward) is None
            totals[i] += _component(r, ENV_REWARD, r.env_reward)
    if any(r.env_reward is not None for _, r in rollouts):
        metrics[f"reward/{ENV_REWARD}/non_finite"] = float(bad)
    for (_, r), total, answer in zip(rollouts, totals, answers):
        if r.failure is not None:  # it could not be scored (a harness that raised or hung): 0, with the reason
            total = 0.0
            r.reward_reasons["failure"] = r.failure
        elif not math.isfinite(total):  # finite components whose weighted sum overflows
            total = 0.0
            r.reward_reasons["total"] = "non-finite (the weighted sum overflowed)"
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



def reward_failures(groups: list[RolloutGroup]) -> dict[str, dict]:
    """Per reward component scored on these rollouts: ``{"rollouts", "errors", "non_finite",
    "first_reason"}`` — rollouts it scored, those where its function failed (raised or returned
    the wrong number of values), those whose value was not finite, and the first failure's reason
    (None if none). Read from the reasons ``score_groups`` records, so it counts the same wherever
    the rollouts were scored (in process, the async producer, rollout workers)."""
    out: dict[str, dict] = {}
    for g in groups:
        for r in g.rollouts:
            for name in r.reward_components:
                rec = out.setdefault(name, {"rollouts": 0, "errors": 0, "non_finite": 0, "first_reason": None})
                rec["rollouts"] += 1
                reason = r.reward_reasons.get(name, "")
                kind = ("errors" if reason.startswith((name + RAISED, name + UNSCORED)) else
                        "non_finite" if reason.startswith(NON_FINITE) else None)
                if kind is not None:
                    rec[kind] += 1
                    rec["first_reason"] = rec["first_reason"] or reason
    return out


def add_failures(total: dict[str, dict], step: dict[str, dict]) -> dict[str, dict]:
    """``total`` with one step's ``reward_failures`` added (counts summed, the earliest reason kept).

    >>> add_failures({"f": {"rollouts": 2, "errors": 2, "non_finite": 0, "first_reason": "a"}},
    ...              {"f": {"rollouts": 2, "errors": 1, "non_finite": 1, "first_reason": "b"}})["f"]
    {'rollouts': 4, 'errors': 3, 'non_finite': 1, 'first_reason': 'a'}
    """
    out = {name: dict(rec) for name, rec in total.items()}
    for name, rec in step.items():
        mine = out.setdefault(name, {"rollouts": 0, "errors": 0, "non_finite": 0, "first_reason": None})
        for key in ("rollouts", "errors", "non_finite"):
            mine[key] += rec[key]
        mine["first_reason"] = mine["first_reason"] or rec["first_reason"]
    return out
