"""``dagrpo`` (optim/dagrpo.py): GRPO's pairwise comparisons without the look-alike pairs.

METHODS.md's test idea: r = [1, 0, 0] with y_1 ≈ y_2 → [.577, 0, −.577]; with no masking it is GRPO.
"""

import math

import pytest
import torch

from rollwise.generate.latr import jaccard as latr_jaccard
from rollwise.optim.advantages import group_advantages
from rollwise.optim.dagrpo import dagrpo_advantages, distinct_pairs
from rollwise.optim.objective import assign_advantages
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup, jaccard

SAME = [1, 2, 3, 4, 5, 6]
OTHER = [9, 8, 7, 6, 5, 4]


def test_look_alike_pair_left_out_by_hand():
    """std([1, 0, 0]) = sqrt(1/3) = .577 (Bessel). y_1 ≈ y_2: A_1 = (1/3)(1 − 0)/.577 = .577 (only y_3
    compared), A_2 = (1/3)(0 − 0)/.577 = 0 (only y_3), A_3 = (1/3)((0 − 1) + (0 − 0))/.577 = −.577."""
    adv = dagrpo_advantages(torch.tensor([1.0, 0, 0]), torch.zeros(3, dtype=torch.long), [SAME, SAME, OTHER])
    s = 1 / math.sqrt(3)
    assert adv.tolist() == pytest.approx([(1 / 3) / s, 0.0, -(1 / 3) / s], abs=1e-5)
    assert adv.tolist() == pytest.approx([0.577, 0.0, -0.577], abs=1e-3)


def test_without_look_alikes_it_is_grpo():
    rewards = torch.tensor([1.0, 0, 0, 1, 0.5, 0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    completions = [[i, i + 1, i + 2, i + 3, i + 4] for i in range(0, 60, 10)]
    adv = dagrpo_advantages(rewards, groups, completions)
    assert adv.tolist() == pytest.approx(group_advantages(rewards.double(), groups).tolist(), abs=1e-12)


def test_threshold_and_n_are_the_knobs():
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 4, 9]  # 4-gram Jaccard 1/3, 2-gram 3/5
    assert distinct_pairs([a, b], 4, 0.3) == [[True, False], [False, True]]
    assert distinct_pairs([a, b], 4, 0.4) == [[True, True], [True, True]]
    assert distinct_pairs([a, b], 2, 0.5) == [[True, False], [False, True]]


def test_no_spread_gives_zero():
    adv = dagrpo_advantages(torch.tensor([1.0, 1.0]), torch.zeros(2, dtype=torch.long), [SAME, OTHER])
    assert adv.tolist() == [0.0, 0.0]


def test_one_jaccard_shared_with_latr():
    assert latr_jaccard is jaccard


def group(rewards, completions):
    rollouts = []
    for r, ids in zip(rewards, completions):
        x = Rollout("p", [1], list(ids), [0.0] * len(ids), [0] * len(ids), "stop")
        x.reward = x.score = r
        rollouts.append(x)
    return RolloutGroup(Prompt("p", "q"), rollouts)


def test_the_preset_differs_from_grpo_on_a_look_alike_group():
    """objective.method=dagrpo through assign_advantages: the look-alike wrong answer gets 0, GRPO's −.577."""
    dagrpo = load_run_config(None, ["objective.method=dagrpo"]).objective
    grpo = load_run_config(None, []).objective
    a, b = [group([1, 0, 0], [SAME, SAME, OTHER])], [group([1, 0, 0], [SAME, SAME, OTHER])]
    assign_advantages(a, dagrpo)
    assign_advantages(b, grpo)
    assert [r.advantage[0] for r in a[0].rollouts] == pytest.approx([0.577, 0.0, -0.577], abs=1e-3)
    assert [r.advantage[0] for r in b[0].rollouts] == pytest.approx([1.155, -0.577, -0.577], abs=1e-3)


class AnchorRounds:
    """The arith task's demonstration and verifier; char-level ids; the policy's own log-probs −0.25."""

    def __init__(self, demo=None):
        self.demo = demo

    def demonstrate(self, prompt):
        from rollwise.tasks.arith import solve

        return self.demo if self.demo is not None else solve(prompt.columns["a"], prompt.columns["op"],
                                                             prompt.columns["b"])

    def encode_text(self, text):
        return [ord(c) for c in text]

    def logprobs(self, prompt_ids, completion_ids):
        return [-0.25] * len(completion_ids)

    def score(self, groups):
        from rollwise.filter.arith import arith_reward

        for g in groups:
            for r in g.rollouts:
                r.reward = r.score = float(arith_reward([""], [r.completion_text], answer=[g.prompt.answer])[0])
        return {}


def arith_group(rewards):
    from rollwise.tasks.arith import make_prompt

    prompt = make_prompt("p", 12, "+", 7)
    prompt.token_ids = [1, 2, 3]
    g = group(rewards, [[5, 6]] * len(rewards))
    g.prompt = prompt
    return g


def test_anchors_join_groups_with_at_most_one_positive():
    """METHODS.md: one reference answer (r = 1, ratio fixed at 1: behaviour log-probs = the policy's own) joins a
    group with at most one positive; a group with two positives gets none; a reference that does not verify none."""
    from rollwise.generate.anchor import add_anchors

    hard, easy = arith_group([1, 0, 0]), arith_group([1, 1, 0])
    metrics = add_anchors([hard, easy], AnchorRounds(), (99,))
    assert len(hard.rollouts) == 4 and len(easy.rollouts) == 3
    anchor = hard.rollouts[-1]
    assert anchor.completion_text == " 2+7+0=09 1+0+0=01 #19" and anchor.reward == 1.0
    assert anchor.completion_ids == [ord(c) for c in anchor.completion_text] + [99]
    assert anchor.prompt_ids == [1, 2, 3] and anchor.behavior_logprobs == [-0.25] * len(anchor.completion_ids)
    assert metrics == {"anchor/tried": 1.0, "anchor/added": 1.0}
    wrong = arith_group([0, 0])
    assert add_anchors([wrong], AnchorRounds(demo=" #20"), (99,))["anchor/added"] == 0 and len(wrong.rollouts) == 2


def test_the_preset_turns_anchors_on_for_flat_groups_only():
    from rollwise.config import ConfigError
    from rollwise.engine.sampling import SamplingParams
    from rollwise.generate import build_generator

    cfg = load_run_config(None, ["objective.method=dagrpo"])
    assert cfg.rollout.anchors and not load_run_config(None, ["objective.method=dagrpo", "rollout.anchors=false"]
                                                       ).rollout.anchors
    assert build_generator(cfg.rollout, SamplingParams(), str).anchors
    with pytest.raises(ConfigError, match="rollout.anchors"):
        build_generator(load_run_config(None, ["objective.method=dagrpo", "rollout.strategy=tree"]).rollout,
                        SamplingParams(), str)
