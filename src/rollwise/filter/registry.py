"""Reward functions known by name, and resolving a recipe's ``rewards:`` list."""

from __future__ import annotations

from collections.abc import Callable

from rollwise.filter.rewards import RewardFn, load_callable


def builtin_rewards() -> dict[str, Callable]:
    from rollwise.filter.code import code_asserts, code_exit, code_io
    from rollwise.filter.math_answer import math_answer
    from rollwise.filter.arith import arith_reward
    from rollwise.filter.countdown import countdown_reward

    return {"arith": arith_reward, "countdown": countdown_reward, "math_answer": math_answer,
            "code_io": code_io, "code_asserts": code_asserts, "code_exit": code_exit}


def resolve_rewards(configs, task) -> tuple[list[RewardFn], RewardFn]:
    """(reward functions to train on, the task's own judge used for eval accuracy).

    ``configs`` null → the task's rewards with weight 1. A name is looked up among the
    built-ins and the task's rewards; ``package.module:function`` imports a user function.
    """
    judge_name, judge_fn = next(iter(task.rewards.items()))
    judge = RewardFn(judge_name, judge_fn)
    if configs is None:
        return [RewardFn(name, fn) for name, fn in task.rewards.items()], judge
    known = {**builtin_rewards(), **task.rewards}
    fns = []
    for i, rc in enumerate(configs):
        if ":" in rc.name:
            fns.append(RewardFn(rc.name.split(":")[-1], load_callable(rc.name), rc.weight))
        elif rc.name in known:
            fns.append(RewardFn(rc.name, known[rc.name], rc.weight))
        else:
            raise ValueError(
                f"rewards[{i}].name '{rc.name}' is not a known reward ({', '.join(sorted(known))}) "
                "nor an importable 'package.module:function'"
            )
    if not fns:
        raise ValueError("rewards is an empty list; remove it to use the task's own rewards")
    return fns, judge
