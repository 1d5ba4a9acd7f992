"""Reward functions known by name, and resolving a recipe's ``rewards:`` list and the eval judge.

The eval judge (what eval accuracy, pass@k, maj@k and ``summary.json`` count as correct: a score
above 0.5, ``rollwise.types.is_correct``) is the task's own reward — its verifier, or for
``task.name: file`` ``task.reward`` — except for a file task without ``task.reward``: then it is
the first entry of ``rewards:`` but ``majority_vote`` (``Task.judge_from_rewards``; majority_vote
asks the judge what each completion answered). A judge that is not among the
run's training rewards is warned about once, when the rewards are resolved.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from rollwise.config import ConfigError
from rollwise.filter.majority_vote import MajorityVote, majority_vote
from rollwise.filter.rewards import RewardFn, load_callable

log = logging.getLogger(__name__)

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
    from rollwise.filter.io_lang import io_verifier  # per-language YAML (Agnostics)

    bound["io_verifier"] = functools.update_wrapper(functools.partial(io_verifier, sandbox=sandbox), io_verifier)
    from rollwise.filter.fapo import Fapo, arith_working
    from rollwise.filter.judge import Judge
    from rollwise.filter.pow3r import Pow3r
    from rollwise.filter.soft_verify import TestThreshold
    from rollwise.filter.weaver import Weaver

    return {"arith": arith_reward, "countdown": countdown_reward, "math_answer": math_answer, "majority_vote": majority_vote, **bound,
            "judge": Judge,  # built from its rewards[].judge section (resolve_rewards)
            "fapo": Fapo(),  # scores whole groups (score_groups)
            "arith_working": arith_working, "pow3r": Pow3r,  # pow3r, weaver: built from their sections (configured)
            "weaver": Weaver, "test_threshold": TestThreshold}  # test_threshold: its section, a judge for few tests


def reward_function(spec: str, key: str, known: dict[str, Callable]) -> tuple[str, Callable]:
    """(name, function) of a reward spec: a name in ``known`` or ``package.module:function``
    (imported by ``rollwise.imports``' rule; its name is the function's). ``key``: the config key."""
    if ":" in spec:
        return spec.split(":")[-1], load_callable(spec, key)
    if spec in known:
        return spec, known[spec]
    raise ConfigError(f"{key} '{spec}' is not a known reward ({', '.join(sorted(known))}) "
                      "nor an importable 'package.module:function'")


def configured(rc, i: int, known: dict[str, Callable], task=None) -> tuple[str, Callable]:
    """(name, function) of ``rewards[i]``: a judge built from its section, else ``reward_function``."""
    if rc.name == "fapo" and task is not None and task.name != "arith":
        raise ConfigError(f"rewards[{i}]: fapo's flaw detector reads arith's column working; it scores "
                          f"task.name=arith only (this run's task is {task.name})")
    if rc.name == "judge":
        from rollwise.filter.judge import Judge

        return rc.name, Judge(rc.judge, name=rc.name)
    if rc.name == "pow3r":  # its criteria are rewards too, resolved here (a judge criterion: its rubric)
        from rollwise.filter.pow3r import Pow3r, Pow3rConfig

        cfg = getattr(rc, "pow3r", None)
        if cfg is None and task is not None and task.name != "arith":
            raise ConfigError(f"rewards[{i}]: pow3r's default rubric is arith's answer and working; list this "
                              f"task's criteria under rewards[{i}].pow3r.criteria")
        cfg = cfg or Pow3rConfig()
        return rc.name, Pow3r(cfg, [configured(c, i, known, task) for c in cfg.criteria])
    if rc.name == "test_threshold":  # tests at a threshold; a judge (its soft verifier) where tests are few
        from rollwise.filter.judge import Judge
        from rollwise.filter.soft_verify import TestThreshold, TestThresholdConfig

        cfg = getattr(rc, "test_threshold", None) or TestThresholdConfig()
        judge = Judge(cfg.judge, name=rc.name) if cfg.judge is not None else None
        return rc.name, TestThreshold(cfg, known[cfg.tests], judge)
    if rc.name == "weaver":  # its verifiers are rewards (or judges), resolved here
        from rollwise.filter.weaver import Weaver, WeaverConfig

        cfg = getattr(rc, "weaver", None)
        if cfg is None and task is not None and task.name != "arith":
            raise ConfigError(f"rewards[{i}]: weaver's default verifiers are arith's checks; list this task's "
                              f"verifiers under rewards[{i}].weaver.verifiers")
        cfg = cfg or WeaverConfig()
        return rc.name, Weaver(cfg, [configured(v, i, known, task) for v in cfg.verifiers])
    return reward_function(rc.name, f"rewards[{i}].name", known)


def resolve_rewards(configs, task, sandbox=None, warn: bool = True) -> tuple[list[RewardFn], RewardFn]:
    """(reward functions to train on, the eval judge; see the module docstring).

    ``configs`` null → the task's rewards with weight 1. A name is looked up among the
    built-ins and the task's rewards; ``package.module:function`` imports a user function.
    ``warn``: log the judge warning (the driver does; rollout workers resolve the same list again).
    """
    if configs is None:
        if not task.rewards:
            raise ConfigError("nothing scores this task's rollouts: list your reward functions under rewards: "
                              "(the first is the eval judge), or set task.reward, or set task.answer_field for "
                              "the default math_answer")
        fns = [RewardFn(name, fn) for name, fn in task.rewards.items()]
    else:
        known = {**builtin_rewards(sandbox), **task.rewards}
        fns = [RewardFn(*configured(rc, i, known, task), rc.weight) for i, rc in enumerate(configs)]
        if not fns:
            raise ConfigError("rewards is an empty list; remove it to use the task's own rewards")
    judged = [f for f in fns if f.fn is not majority_vote]  # majority_vote reads the judge's answers: never it
    if task.judge_from_rewards and configs and judged:
        judge = RewardFn(judged[0].name, judged[0].fn)  # weight 1: correct = its own score above 0.5
    elif task.rewards:
        judge = RewardFn(*next(iter(task.rewards.items())))
    else:
        raise ConfigError("majority_vote needs a verifier to read each completion's answer: set task.answer_field "
                          "(math_answer) or task.reward, or list the verifier under rewards: too")
    for i, f in enumerate(fns):
        if f.fn is majority_vote:  # bound to the judge: it asks the judge what each completion answered
            f.fn = MajorityVote(judge, configs[i].majority_vote)
    if warn and not any(f.fn is judge.fn or f.name == judge.name or getattr(f.fn, "verifier", None) is judge
                        or getattr(f.fn, "verifier_name", None) == judge.name for f in fns):  # fapo: arith's check
        log.warning("the eval judge '%s' is not among this run's training rewards (%s): eval accuracy, pass@k and "
                    "maj@k measure what training does not reward. The judge is task.reward (task.name: file; "
                    "unset: the first of rewards:), else the task's own verifier", judge.name,
                    ", ".join(f.name for f in fns))
    return fns, judge
