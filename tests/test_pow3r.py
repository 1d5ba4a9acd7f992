"""``pow3r`` (issue 36 §1): criterion weights follow each criterion's within-group contrast.

METHODS.md's test idea by hand: criteria (w .5, contrast .4) and (w .5, contrast 0) → ŵ = (.9, .1);
equal contrasts → ŵ = w. Then on groups: the reward is Σ ŵ_c·s_c, it differs from the fixed
weighted sum, a rubric criterion goes through the judge, and the EMA smooths across calls.
"""

import pytest

from rollwise.filter.fapo import arith_working
from rollwise.filter.judge import Judge, JudgeConfig
from rollwise.filter.judge_backends import JudgeReply
from rollwise.filter.pow3r import Pow3r, Pow3rConfig, Pow3rCriterion, group_contrast, pow3r_weights
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.tasks.arith import make_prompt
from rollwise.types import Rollout, RolloutGroup

CLEAN = " 7+8+0=15 4+5+1=10 3+0+1=04 #405"
FLAWED = " 7+8+0=15 4+5+0=09 3+0+1=04 #405"
WRONG_CLEAN_LOOKING = " 7+8+0=15 4+5+1=10 3+0+1=04 #406"


def _group(*texts, pid="p"):
    p = make_prompt(pid, 347, "+", 58)
    return RolloutGroup(p, [Rollout(pid, [1], [5], [0.0], [0], "stop", completion_text=t) for t in texts])


def _pow3r(**kw):
    from rollwise.filter.arith import arith_reward

    cfg = Pow3rConfig(**kw)
    fns = {"arith": arith_reward, "arith_working": arith_working}
    return Pow3r(cfg, [(c.name, fns[c.name]) for c in cfg.criteria])


def test_weights_by_hand():
    assert pow3r_weights([.5, .5], [.4, 0.0], ["r", "r"]) == pytest.approx([.9, .1])
    assert pow3r_weights([.2, .8], [.3, .3], ["r", "r"]) == pytest.approx([.2, .8])
    # each category keeps its human total: a criterion alone in its category keeps its weight
    assert pow3r_weights([.5, .5, .4], [.4, 0.0, 0.0], ["r", "r", "s"]) == pytest.approx([.9, .1, .4])
    assert group_contrast([1, 0, 1, 1], [2, 2]) == pytest.approx((0.5 ** 0.5 + 0) / 2)  # Bessel std per group


def test_the_reward_is_the_contrast_weighted_rubric_and_differs_from_the_fixed_sum():
    # answer: [1, 1, 0] (contrast = std 0.577); working: [1, 0, 1] (the same contrast) -> equal weights
    # a second group where the answer is saturated (all right) but the working splits them
    pow3r = _pow3r(criteria=[{"name": "arith", "weight": .5}, {"name": "arith_working", "weight": .5}])
    g1, g2 = _group(CLEAN, FLAWED, WRONG_CLEAN_LOOKING), _group(CLEAN, CLEAN, FLAWED, pid="q")
    metrics = score_groups([g1, g2], [RewardFn("pow3r", pow3r)])
    s = 3 ** -0.5  # std([1, 1, 0]) = std([1, 0, 1]) with Bessel
    answer_c, working_c = s / 2, s  # group q: answer std 0 (saturated), working std([1, 1, 0]) = .577
    assert metrics["pow3r/contrast/arith"] == pytest.approx(answer_c)
    assert metrics["pow3r/contrast/arith_working"] == pytest.approx(working_c)
    w_a = (answer_c + .05) / (answer_c + working_c + .1)  # .5 each, one category of total 1
    assert metrics["pow3r/weight/arith"] == pytest.approx(w_a)
    assert g1.rewards == pytest.approx([1.0, w_a, 1 - w_a])
    assert g2.rewards == pytest.approx([1.0, 1.0, w_a])
    fixed = [0.5 * x + 0.5 * y for x, y in ((1, 1), (1, 0), (0, 1))]  # the plain weighted sum (rewards: list)
    assert g1.rewards != pytest.approx(fixed)
    assert g1.rollouts[1].reward_reasons["pow3r"].startswith("arith 0.")
    assert g1.rollouts[2].extracted_answer == "406"


def test_the_weights_move_by_an_ema_across_calls():
    pow3r = _pow3r(criteria=[{"name": "arith", "weight": .5}, {"name": "arith_working", "weight": .5}], ema=0.9)
    first = score_groups([_group(CLEAN, WRONG_CLEAN_LOOKING)], [RewardFn("pow3r", pow3r)])  # only the answer splits
    assert first["pow3r/weight/arith"] == pytest.approx(.5 * (2 ** -0.5 + .05) / (.5 * (2 ** -0.5 + .1)))
    second = score_groups([_group(CLEAN, FLAWED)], [RewardFn("pow3r", pow3r)])  # only the working splits
    now = .5 * .05 / (.5 * (2 ** -0.5 + .1))
    assert second["pow3r/weight/arith"] == pytest.approx(.9 * first["pow3r/weight/arith"] + .1 * now)


def test_a_rubric_criterion_goes_through_the_judge():
    class Scripted:
        def complete(self, texts):
            return [JudgeReply("Shown. Score: 10" if "4+5+1=10" in t else "Missing. Score: 0", 5, 2) for t in texts]

    from rollwise.filter.arith import arith_reward

    judge = Judge(JudgeConfig(base_url="http://unused.invalid/v1", api_model="m"), backend=Scripted())
    cfg = Pow3rConfig(criteria=[{"name": "arith"}, {"name": "judge", "judge": {"base_url": "http://x/v1",
                                                                               "api_model": "m"}}])
    pow3r = Pow3r(cfg, [("arith", arith_reward), ("judge", judge)])
    g = _group(CLEAN, FLAWED, WRONG_CLEAN_LOOKING)
    metrics = score_groups([g], [RewardFn("pow3r", pow3r)])
    assert metrics["judge/requests"] == 3.0  # one batch, its tokens counted
    assert metrics["pow3r/contrast/judge"] == pytest.approx(3 ** -0.5)
    assert g.rewards[0] == pytest.approx(2.0) and g.rewards[1] == pytest.approx(metrics["pow3r/weight/arith"])


def test_pow3r_is_one_config_line_and_an_arm():
    from rollwise.bench.ablate import arm_lines, default_arms
    from rollwise.config import ConfigError
    from rollwise.filter.registry import resolve_rewards
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["rewards=[{name: pow3r}]"])  # default rubric: arith's answer and its working
    fns, judge = resolve_rewards(cfg.rewards, cfg.task.build(0), warn=False)
    assert isinstance(fns[0].fn, Pow3r) and fns[0].fn.names == ["arith", "arith_working"] and judge.name == "arith"
    with pytest.raises(ConfigError, match="only a pow3r reward has this section"):
        load_run_config(None, ["rewards=[{name: arith, pow3r: {}}]"])
    assert "reward:pow3r" in default_arms() and arm_lines("reward:pow3r") == ["rewards=[{name: pow3r}]"]
    assert Pow3rCriterion(name="x").category == "rubric"
    countdown = load_run_config(None, ["task.name=countdown", "rewards=[{name: pow3r}]"])
    with pytest.raises(ConfigError, match="list this task's criteria"):
        resolve_rewards(countdown.rewards, countdown.task.build(0), warn=False)
    with pytest.raises(ConfigError, match="a judge needs its section"):
        load_run_config(None, ["rewards=[{name: pow3r, pow3r: {criteria: [{name: arith}, {name: judge}]}}]"])
    for reward in ("pow3r", "weaver"):  # run-long state: scored on the driver, where the checkpoint keeps it
        with pytest.raises(ConfigError, match="Set rollout.score_on: driver"):
            load_run_config(None, [f"rewards=[{{name: {reward}}}]", "rollout.workers=2"])
        load_run_config(None, [f"rewards=[{{name: {reward}}}]", "rollout.workers=2", "rollout.score_on=driver"])
