"""Reward functions known by name, and resolving a recipe's ``rewards:`` list."""

from __future__ import annotations

import functools
from collections.abc import Callable

from rollwise.config import ConfigError
from rollwise.filter.rewards import RewardFn, load_callable


CODE_REWARDS = ("code_io", "code_asserts", "code_exit")


def builtin_rewards(sandbox=None) -> dict[str, Callable]:
    """The built-in rewards by name; the code rewards bound to ``sandbox`` (the run's
    ``rollwise.filter.sandbox.Sandbox``), so they keep TRL's calling convention."""
    from rollwise.filter import code
    from rollwise.filter.arith import arith_reward
    from rollwise.filter.countdown import countdown_reward
    from rollwise.filter.math_answer import math_answer

    bound = {name: functools.update_wrapper(functools.partial(getattr(code, name), sandbox=sandbox),
                                            getattr(code, name)) for name in CODE_REWARDS}
    return {"arith": arith_reward, "countdown": countdown_reward, "math_answer": math_answer, **bound}


def resolve_rewards(configs, task, sandbox=None) -> tuple[list[RewardFn], RewardFn]:
    """(reward functions to train on, the task's own judge used for eval accuracy).

    ``configs`` null → the task's rewards with weight 1. A name is looked up among the
    built-ins and the task's rewards; ``package.module:function`` imports a user function.
    """
    judge_name, judge_fn = next(iter(task.rewards.items()))
    judge = RewardFn(judge_name, judge_fn)
    if configs is None:
        return [RewardFn(name, fn) for name, fn in task.rewards.items()], judge
    known = {**builtin_rewards(sandbox), **task.rewards}
    fns = []
    for i, rc in enumerate(configs):
        if ":" in rc.name:
            fns.append(RewardFn(rc.name.split(":")[-1], load_callable(rc.name), rc.weight))
        elif rc.name in known:
            fns.append(RewardFn(rc.name, known[rc.name], rc.weight))
        else:
            raise ConfigError(
                f"rewards[{i}].name '{rc.name}' is not a known reward ({', '.join(sorted(known))}) "
                "nor an importable 'package.module:function'"
            )
    if not fns:
        raise ConfigError("rewards is an empty list; remove it to use the task's own rewards")
    return fns, judge
