"""``gigpo``: GiGPO's episode + anchor-state step advantages on multi-turn episodes (issue 24).

A = A^E + A^S: A^E is GRPO over the group's episode rewards; A^S z-scores a turn's discounted
return R_t = r_t + γ·R_{t+1} (the episode reward added to the last turn's step reward) among the
group's turns taken from the same anchor state. Every expected number is worked out by hand in a
comment next to it (the METHODS.md cases first).
"""

import copy
import math

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from rollwise.optim.advantages import anchor_advantages, discounted_returns, gigpo_advantages, group_advantages
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import PRESETS, ObjectiveConfig, assign_advantages
from rollwise.optim.update import UpdateSpec, policy_update
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn

EPS = 1e-6
# every episode below: turn 0 on completion tokens [0, 2), two tokens the environment inserted
# [2, 4) (loss weight 0), turn 1 on [4, 6)
SPANS = [(0, 2), (4, 6)]
WEIGHTS = [1, 1, 0, 0, 1, 1]


def episode(reward, states, step_rewards=(0.0, 0.0), ids=(5, 6, 7, 8, 9, 10), prompt="p"):
    turns = [Turn(s, e, state, r) for (s, e), state, r in zip(SPANS, states, step_rewards)]
    return Rollout(prompt_id=prompt, prompt_ids=[1, 2], completion_ids=list(ids), behavior_logprobs=[-1.0] * 6,
                   versions=[0] * 6, finish_reason="stop", reward=reward, score=reward, loss_weights=list(WEIGHTS),
                   turns=turns)


def single(reward, n=3, prompt="p"):
    """A rollout without turns: one completion."""
    return Rollout(prompt_id=prompt, prompt_ids=[1, 2], completion_ids=[5] * n, behavior_logprobs=[-1.0] * n,
                   versions=[0] * n, finish_reason="stop", reward=reward, score=reward)


def group(rollouts, prompt="p"):
    return RolloutGroup(Prompt(prompt, "x", token_ids=[1, 2]), rollouts)


def per_turn(advantage):
    """The advantage of each turn (its tokens agree) and of the inserted tokens, of one 6-token episode."""
    assert advantage[0] == advantage[1] and advantage[4] == advantage[5]
    return advantage[0], advantage[4], advantage[2:4]


# -- the METHODS.md cases --------------------------------------------------------------------
def test_returns_one_and_zero_from_one_state_give_pm_707():
    # mean .5, Bessel std sqrt((.25 + .25) / 1) = .70711 -> ±.5 / .70711 = ±.70711
    a = anchor_advantages([1.0, 0.0], ["s", "s"])
    assert a == pytest.approx([0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)], abs=1e-12)
    assert a == pytest.approx([0.7071, -0.7071], abs=1e-4)  # population std (.5) would give ±1


def test_no_repeated_states_is_exactly_grpo():
    # two groups; states never repeat within a group (one is None, unknown), some turns have step
    # rewards; the same key "s0" in the other group is another prompt's state and groups nothing
    groups = [group([episode(1.0, ["s0", "a"], (0.3, 0.0)), episode(0.0, ["b", None]),
                     episode(0.0, ["c", "d"], (0.0, -1.0))], prompt="p"),
              group([episode(1.0, ["s0", "e"], prompt="q"), episode(0.5, ["f", "g"], prompt="q")], prompt="q")]
    grpo = copy.deepcopy(groups)
    assign_advantages(groups, ObjectiveConfig(method="gigpo"))
    assign_advantages(grpo, ObjectiveConfig(method="grpo"))
    for g, ref in zip(groups, grpo):
        for r, r_grpo in zip(g.rollouts, ref.rollouts):
            first, second, inserted = per_turn(r.advantage)
            assert first == second == r_grpo.advantage[0]  # exactly: A^S is 0.0, not a rounding residue
            assert inserted == [0.0, 0.0]  # environment tokens: not trained, advantage 0
    expected = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5]), torch.tensor([0, 0, 0, 1, 1]))
    assert [r.advantage[0] for g in groups for r in g.rollouts] == pytest.approx(expected.tolist(), abs=1e-6)


# -- hand cases ------------------------------------------------------------------------------
def test_discounted_returns_add_the_episode_reward_to_the_last_turn():
    # γ = .95: R_2 = r_2 + 1 = 1.2; R_1 = -.1 + .95·1.2 = 1.04; R_0 = 0 + .95·1.04 = .988
    assert discounted_returns([0.0, -0.1, 0.2], 1.0, 0.95) == pytest.approx([0.988, 1.04, 1.2], abs=1e-12)
    assert discounted_returns([0.0], 2.0, 0.95) == [2.0]  # one turn: its reward + the episode's
    assert discounted_returns([], 1.0, 0.95) == []


def test_anchor_groups_of_one_none_and_equal_returns_get_zero():
    a = anchor_advantages([3.0, 1.0, 1.0, 2.0, 7.0], ["x", None, None, "y", "y"])
    # "x" alone; None never groups (two None states are not one state); "y": 2 and 7 -> ±.7071
    assert a[:3] == [0.0, 0.0, 0.0]
    assert a[3:] == pytest.approx([-0.7071, 0.7071], abs=1e-4)
    assert anchor_advantages([0.9025, 0.9025], ["s", "s"]) == [0.0, 0.0]  # no spread: no action was better


def test_three_episodes_two_turns_shared_first_state_by_hand():
    # episodes A, B, C all start in s0; A and B reach s1, C reaches s2. Episode rewards 1, 0, 1;
    # C's first action costs a step reward -.1. γ = .95.
    g = group([episode(1.0, ["s0", "s1"]), episode(0.0, ["s0", "s1"]), episode(1.0, ["s0", "s2"], (-0.1, 0.0))])
    metrics = assign_advantages([g], ObjectiveConfig(method="gigpo"))
    # A^E: rewards 1, 0, 1; mean 2/3, Bessel std sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3) = .57735
    #   -> (1/3)/.57735 = .57735, (-2/3)/.57735 = -1.15470, .57735
    ae = [0.577349, -1.154699, 0.577349]
    # returns: A: R_1 = 0 + 1 = 1, R_0 = .95·1 = .95; B: 0, 0; C: R_1 = 1, R_0 = -.1 + .95·1 = .85
    # s0 = {.95, 0, .85}: mean .6, deviations .35, -.6, .25; Σ sq = .1225 + .36 + .0625 = .545,
    #   Bessel var .2725, std .522015 -> A^S = .670477, -1.149389, .478912
    # s1 = {A: 1, B: 0} -> ±.707106; s2 = {C} alone -> 0
    first = [0.577349 + 0.670477, -1.154699 - 1.149389, 0.577349 + 0.478912]  # 1.247826, -2.304088, 1.056261
    second = [0.577349 + 0.707106, -1.154699 - 0.707106, 0.577349 + 0.0]  # 1.284455, -1.861805, .577349
    for r, a0, a1 in zip(g.rollouts, first, second):
        t0, t1, inserted = per_turn(r.advantage)
        assert (t0, t1) == pytest.approx((a0, a1), abs=2e-6)
        assert inserted == [0.0, 0.0]
    # the pure function gives the two terms apart
    episode_adv, step = gigpo_advantages(torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.long),
                                         [[0.0, 0.0], [0.0, 0.0], [-0.1, 0.0]],
                                         [["s0", "s1"], ["s0", "s1"], ["s0", "s2"]], gamma=0.95)
    assert episode_adv.tolist() == pytest.approx(ae, abs=2e-6)
    assert [a for s in step for a in s] == pytest.approx([0.670477, 0.707106, -1.149389, -0.707106, 0.478912, 0.0],
                                                         abs=2e-6)
    assert metrics["gigpo/turns_with_step_signal"] == pytest.approx(5 / 6)  # all but C's turn in s2
    assert metrics["gigpo/step_abs_mean"] == pytest.approx((0.670477 + 1.149389 + 0.478912 + 2 * 0.707106) / 6,
                                                           abs=1e-5)


def test_gamma_moves_the_step_term_only():
    # γ = .5: A's first return .5·1 = .5, B's 0 -> s0 = {.5, 0}: ±.7071 whatever γ; with a third
    # episode C (reward 1, no step rewards) in s0 too: {.5, 0, .5} -> mean 1/3, deviations
    # 1/6, -1/3, 1/6, Bessel std sqrt((1/36 + 1/9 + 1/36)/2) = sqrt(1/12) = .288675 -> .57735, -1.1547
    args = (torch.tensor([1.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.long), [[0.0, 0.0]] * 3,
            [["s0", "a"], ["s0", "b"], ["s0", "c"]])
    episode_adv, step = gigpo_advantages(*args, gamma=0.5)
    assert [s[0] for s in step] == pytest.approx([0.57735, -1.1547, 0.57735], abs=1e-5)
    same_episode, _ = gigpo_advantages(*args, gamma=0.95)
    assert torch.equal(episode_adv, same_episode)


def test_a_rollout_without_turns_gets_plain_grpo():
    # all single completions: the estimator is GRPO, token for token
    g, ref = group([single(1.0), single(0.0), single(0.0)]), group([single(1.0), single(0.0), single(0.0)])
    assign_advantages([g], ObjectiveConfig(method="gigpo"))
    assign_advantages([ref], ObjectiveConfig(method="grpo"))
    assert [r.advantage for r in g.rollouts] == [r.advantage for r in ref.rollouts]
    # beside two episodes that share a state: it gets its A^E on every token, no step term.
    # rewards 1, 0, 1: A^E = .57735, -1.1547, .57735; returns from s0: .95 and 0 -> ±.7071
    g = group([episode(1.0, ["s0", "a"]), episode(0.0, ["s0", "b"]), single(1.0)])
    assign_advantages([g], ObjectiveConfig(method="gigpo"))
    assert g.rollouts[2].advantage == pytest.approx([0.577349] * 3, abs=2e-6)
    assert per_turn(g.rollouts[0].advantage)[:2] == pytest.approx((0.577349 + 0.707106, 0.577349), abs=2e-6)
    assert per_turn(g.rollouts[1].advantage)[:2] == pytest.approx((-1.154699 - 0.707106, -1.154699), abs=2e-6)


def test_a_turn_outside_the_completion_is_an_error():
    bad = episode(1.0, ["s0", "s1"])
    bad.turns = [Turn(0, 2, "s0"), Turn(4, 9, "s1")]
    with pytest.raises(ValueError, match=r"turn \[4, 9\) is outside its 6 completion tokens"):
        assign_advantages([group([bad, episode(0.0, ["s0", "s1"])])], ObjectiveConfig(method="gigpo"))


# -- the preset ------------------------------------------------------------------------------
def test_the_preset_is_grpo_with_the_gigpo_estimator():
    cfg = ObjectiveConfig(method="gigpo")
    assert (cfg.advantage, cfg.gigpo_gamma, cfg.scale_rewards, cfg.loss_agg) == ("gigpo", 0.95, "group",
                                                                                 "seq_mean_token_mean")
    assert {k: v for k, v in PRESETS["gigpo"].items() if k != "advantage"} == PRESETS["grpo"]
    assert ObjectiveConfig(method="gigpo", gigpo_gamma=0.5).gigpo_gamma == 0.5
    with pytest.raises(ValidationError):
        ObjectiveConfig(method="gigpo", gigpo_gamma=1.5)


def test_rollwise_list_shows_the_preset():
    from rollwise.cli import app

    result = CliRunner().invoke(app, ["list", "objectives"])
    assert result.exit_code == 0, result.output
    assert any(line.split()[:2] == ["gigpo", "advantage=gigpo,"] for line in result.output.splitlines())


def test_the_preset_trains(tiny):
    """The hand case end to end: the batch carries the hand-computed advantages on the turn tokens,
    nothing on the inserted ones, and one update trains exactly the turn tokens."""
    model, tok = tiny
    objective = ObjectiveConfig(method="gigpo")
    g = group([episode(1.0, ["s0", "s1"], ids=(5, 6, 7, 8, 9, 10)),
               episode(0.0, ["s0", "s1"], ids=(11, 12, 7, 8, 13, 14)),
               episode(1.0, ["s0", "s2"], (-0.1, 0.0), ids=(15, 16, 7, 8, 17, 18))])
    assign_advantages([g], objective)
    batch = build_batch([g], tok.pad_token_id)
    # column p - 1 + t scores completion token t (p = 2 prompt tokens)
    hand = [[1.247826] * 2 + [0.0] * 2 + [1.284455] * 2, [-2.304088] * 2 + [0.0] * 2 + [-1.861805] * 2,
            [1.056261] * 2 + [0.0] * 2 + [0.577349] * 2]
    for row, expected in zip(batch.advantages[:, 1:7].tolist(), hand):
        assert row == pytest.approx(expected, abs=2e-6)
    assert batch.advantages[:, 0].tolist() == [0.0] * 3  # the prompt's column
    assert batch.loss_weights[:, 1:7].tolist() == [WEIGHTS] * 3
    m = copy.deepcopy(model)
    before = [p.detach().clone() for p in m.parameters()]
    spec = UpdateSpec(objective, micro_batch_size=4, max_len=6, max_grad_norm=1e9)
    metrics = policy_update(m, torch.optim.SGD(m.parameters(), lr=1e-2), batch, spec)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["update/trained_tokens"] == 12  # 3 episodes x 2 turns x 2 tokens; inserted tokens untrained
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))
