"""``concise_r`` (optim/concise_r.py): L-GRPO's length term on all-correct groups (ConciseR stage 2).

METHODS.md's test idea: a group containing a wrong answer ignores length; in stage 2 an all-correct
group gets r = 1 + .5·(1 − |y|/L_max).
"""

from types import SimpleNamespace

import pytest

from rollwise.optim.concise_r import add_length_terms, length_terms
from rollwise.optim.objective import assign_advantages
from rollwise.train.collect import RoundSampler
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup


def group(rewards, lengths):
    rollouts = []
    for r, n in zip(rewards, lengths):
        x = Rollout("p", [1], [7] * n, [0.0] * n, [0] * n, "stop")
        x.reward = x.score = float(r)
        rollouts.append(x)
    return RolloutGroup(Prompt("p", "q"), rollouts)


def test_all_correct_group_by_hand():
    """L_max = 40: |y| = 10 → 1 + .5·(1 − 10/40) = 1.375; |y| = 30 → 1 + .5·(1 − 30/40) = 1.125; |y| = 40 → 1."""
    g = group([1, 1, 1], [10, 30, 40])
    metrics = add_length_terms([g], 40)
    assert g.rewards == pytest.approx([1.375, 1.125, 1.0])
    assert [r.reward_components["concise_r"] for r in g.rollouts] == pytest.approx([0.375, 0.125, 0.0])
    assert [r.correct for r in g.rollouts] == [True] * 3  # the verdict (score) is unchanged
    assert metrics == {"concise_r/shaped_groups": 1.0}


def test_a_group_with_a_wrong_answer_ignores_length():
    g = group([1, 0, 1], [10, 30, 40])
    metrics = add_length_terms([g], 40)
    assert g.rewards == [1.0, 0.0, 1.0]
    assert metrics == {"concise_r/shaped_groups": 0.0}
    assert length_terms([True, False], [1, 1], 40) == [0.0, 0.0]


def test_a_failed_rollout_counts_as_not_correct():
    g = group([1, 1], [10, 30])
    g.rollouts[1].failure = "timeout"
    add_length_terms([g], 40)
    assert g.rewards == [1.0, 1.0]


def test_the_preset_is_grpo_plus_plus_and_the_term():
    cfg = load_run_config(None, ["objective.method=concise_r"])
    o = cfg.objective
    assert (o.concise_r, o.concise_r_weight, o.concise_r_start, o.epsilon_high, o.loss_agg) == (
        True, 0.5, 0, 0.28, "token_mean")
    assert cfg.control.method == "dynamic_sampling"
    assert load_run_config(None, []).objective.concise_r is False


def sampler(step, **objective):
    cfg = load_run_config(None, ["objective.method=concise_r", "rollout.max_new_tokens=40",
                                 *[f"objective.{k}={v}" for k, v in objective.items()]])
    trainer = SimpleNamespace(cfg=cfg, step_seed=lambda s: s)
    return RoundSampler(trainer, step, engine=None, clock=None)


def test_stage_two_starts_at_concise_r_start():
    before, after = group([1, 1], [10, 30]), group([1, 1], [10, 30])
    sampler(2, concise_r_start=3).shape([before])
    sampler(3, concise_r_start=3).shape([after])
    assert before.rewards == [1.0, 1.0]
    assert after.rewards == pytest.approx([1.375, 1.125])


def test_it_differs_from_grpo_where_grpo_has_no_signal():
    """An all-correct group: GRPO's advantages are 0 (and dynamic sampling would drop it); with the length
    term the shorter rollout gets A > 0: rewards [1.375, 1.125] → ±.707 with the group std."""
    grpo, concise = group([1, 1], [10, 30]), group([1, 1], [10, 30])
    sampler(0).shape([concise])
    cfg = load_run_config(None, ["objective.method=concise_r"]).objective
    assign_advantages([grpo], cfg)
    assign_advantages([concise], cfg)
    assert [r.advantage[0] for r in grpo.rollouts] == [0.0, 0.0]
    assert [r.advantage[0] for r in concise.rollouts] == pytest.approx([0.7071, -0.7071], abs=1e-3)


def test_concise_r_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    assert "objective:concise_r" in default_arms()
    assert arm_lines("objective:concise_r") == ["objective.method=concise_r"]
