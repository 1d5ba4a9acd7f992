"""``fapo`` (issue 36 §1): flawed positives on arith get 1 − (the group's clean share).

METHODS.md's test idea by hand: [clean, flawed, wrong, wrong] → [1, .75, 0, 0];
[flawed, wrong, wrong, wrong] → [1, 0, 0, 0]. The flaw is concrete: a right answer whose
column working is missing or departs from the task's working at some step.
"""

import pytest

from rollwise.config import ConfigError
from rollwise.filter.arith import arith_reward
from rollwise.filter.fapo import Fapo, arith_flaw, fapo_rewards
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.tasks.arith import make_prompt

CLEAN = " 7+8+0=15 4+5+1=10 3+0+1=04 #405"
FLAWED = " 7+8+0=15 4+5+0=09 3+0+1=04 #405"  # column 2 drops the carry, yet the answer is right
JUMP = " #405"  # the answer alone
WRONG = " 7+8+0=15 4+5+1=10 3+0+1=04 #406"


def _group(*texts):
    from rollwise.types import Rollout, RolloutGroup

    p = make_prompt("p", 347, "+", 58)
    return RolloutGroup(p, [Rollout("p", [1], [5], [0.0], [0], "stop", completion_text=t) for t in texts])


def test_fapo_rewards_by_hand():
    assert fapo_rewards(["clean", "flawed", "wrong", "wrong"]) == pytest.approx([1, 0.75, 0, 0])
    assert fapo_rewards(["flawed", "wrong", "wrong", "wrong"]) == [1, 0, 0, 0]
    assert fapo_rewards(["clean", "clean", "flawed", "flawed"]) == pytest.approx([1, 1, 0.5, 0.5])


def test_the_flaw_is_working_that_is_not_the_tasks():
    assert arith_flaw(347, "+", 58, CLEAN) is None
    assert arith_flaw(347, "+", 58, JUMP) == "no working: the answer alone"
    assert arith_flaw(347, "+", 58, FLAWED) == "step 2 wrote 4+5+0=09, expected 4+5+1=10"
    assert arith_flaw(347, "+", 58, " 7+8+0=15 4+5+1=10 #405") == "2 working steps, expected 3"
    assert arith_flaw(58, "-", 347, " neg 7-8-0=19 4-5-1=18 3-0-1=02 #-289") is None
    assert arith_flaw(58, "-", 347, " 7-8-0=19 4-5-1=18 3-0-1=02 #-289").startswith("step 1 wrote 7-8-0=19")
    assert arith_flaw(347, "*", 58, " #20126") is None  # products have no working: never flawed


def test_fapo_reward_on_a_group_by_hand():
    g = _group(CLEAN, FLAWED, WRONG, WRONG)
    metrics = score_groups([g], [RewardFn("fapo", Fapo())])
    assert g.rewards == pytest.approx([1.0, 0.75, 0.0, 0.0])
    assert g.rollouts[1].reward_reasons["fapo"].startswith("flawed positive (step 2 wrote")
    assert g.rollouts[2].reward_reasons["fapo"] == "wrong answer 406 (expected 405)"
    assert metrics["fapo/flawed_positives"] == 0.5 and metrics["fapo/penalised"] == 1.0
    alone = _group(JUMP, WRONG, WRONG, WRONG)  # no clean solution yet: the flawed positive keeps full credit
    score_groups([alone], [RewardFn("fapo", Fapo())])
    assert alone.rewards == [1.0, 0.0, 0.0, 0.0]
    assert [r.extracted_answer for r in g.rollouts] == ["405", "405", "406", "406"]  # maj@k still votes


def test_fapo_changes_grpo_advantages_where_the_answer_only_reward_cannot_tell():
    base, fapo = _group(CLEAN, FLAWED, WRONG, WRONG), _group(CLEAN, FLAWED, WRONG, WRONG)
    score_groups([base], [RewardFn("arith", arith_reward)])
    score_groups([fapo], [RewardFn("fapo", Fapo())])
    assert base.rewards == [1.0, 1.0, 0.0, 0.0]  # the answer-only verifier admits the flawed working
    cfg = ObjectiveConfig()
    assign_advantages([base], cfg)
    assign_advantages([fapo], cfg)
    a_base, a_fapo = [r.advantage[0] for r in base.rollouts], [r.advantage[0] for r in fapo.rollouts]
    assert a_base[0] == pytest.approx(a_base[1])  # GRPO: clean and flawed alike
    assert a_fapo[0] > a_fapo[1] > 0  # FAPO: the clean solution ahead of the flawed one


def test_fapo_is_one_config_line():
    from rollwise.filter.registry import resolve_rewards
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["rewards=[{name: fapo}]"])
    task = cfg.task.build(cfg.seed)
    fns, judge = resolve_rewards(cfg.rewards, task, warn=False)
    assert isinstance(fns[0].fn, Fapo) and judge.name == "arith"  # eval accuracy stays the answer check
    countdown = load_run_config(None, ["task.name=countdown", "rewards=[{name: fapo}]"])
    with pytest.raises(ConfigError, match="fapo's flaw detector reads arith"):
        resolve_rewards(countdown.rewards, countdown.task.build(0), warn=False)


def test_fapo_is_an_ablation_arm():
    from rollwise.bench.ablate import arm_lines, default_arms, load_ablate_config

    assert "reward:fapo" in default_arms() and arm_lines("reward:fapo") == ["rewards=[{name: fapo}]"]
    assert load_ablate_config(["arms=[reward:fapo]"]).arms == ["reward:fapo"]


def test_no_eval_judge_warning_for_fapo(caplog):
    from rollwise.filter.registry import resolve_rewards
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["rewards=[{name: fapo}]"])
    resolve_rewards(cfg.rewards, cfg.task.build(0))
    assert "not among this run's training rewards" not in caplog.text  # fapo answers with arith's check
