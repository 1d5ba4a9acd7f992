"""``nudge`` (generate/nudge.py, optim/nudge.py): groups split over strategy contexts, trained on the bare prompt.

METHODS.md's test idea: K = 1 with an empty context reduces to GRPO without std. And by hand:
A_{k,i} = (r_{k,i} − r̄_k) + .5·(r̄_k − r̄) + .1·1[correct, conditioned].
"""

import pytest
import torch

from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.generate.group import GroupSampler
from rollwise.generate.nudge import NudgeConfig, NudgeSampler
from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.optim.advantages import group_advantages
from rollwise.optim.nudge import nudge_advantages
from rollwise.optim.objective import assign_advantages
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup


def test_the_advantage_by_hand():
    """Context A: [1, 0] (r̄_A = .5), context B: [1, 1] (r̄_B = 1), r̄ = .75. A: 1 − .5 + .5(.5 − .75) + .1 = .475,
    0 − .5 − .125 = −.625; B: 0 + .5(1 − .75) + .1 = .225 each."""
    adv = nudge_advantages(torch.tensor([1.0, 0, 1, 1]), torch.zeros(4, dtype=torch.long),
                           torch.tensor([0, 0, 1, 1]), torch.tensor([True, False, True, True]))
    assert adv.tolist() == pytest.approx([0.475, -0.625, 0.225, 0.225])
    plain = nudge_advantages(torch.tensor([1.0, 0, 1, 1]), torch.zeros(4, dtype=torch.long),
                             torch.tensor([0, 0, 1, 1]), torch.zeros(4, dtype=torch.bool), inter=1.0)
    assert plain.tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25])  # inter = 1, no distillation: r − r̄


def test_one_empty_context_is_grpo_without_std():
    rewards = torch.tensor([1.0, 0, 0, 1, 0.5, 0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = nudge_advantages(rewards, groups, groups, torch.zeros(6, dtype=torch.bool))
    assert adv.tolist() == pytest.approx(group_advantages(rewards.double(), groups, "none").tolist())


def rollout(reward, context):
    r = Rollout("p", [1], [5, 6], [-1.0, -1.0], [0, 0], "stop", context=context)
    r.reward = r.score = reward
    return r


def test_the_strategy_fills_its_objective_and_differs_from_grpo():
    cfg = load_run_config(None, ["rollout.strategy=nudge"])
    o = cfg.objective
    assert (o.advantage, o.scale_rewards, o.tis_mode, o.tis_cap) == ("nudge", "none", "token_truncate", 2.0)
    assert len(cfg.rollout.nudge.contexts) == 4
    groups = [RolloutGroup(Prompt("p", "q"), [rollout(1, "a"), rollout(0, "a"), rollout(1, "b"), rollout(1, "b")])]
    assign_advantages(groups, o)
    assert [r.advantage[0] for r in groups[0].rollouts] == pytest.approx([0.475, -0.625, 0.225, 0.225])
    grpo = load_run_config(None, ["objective.scale_rewards=none"]).objective
    assign_advantages(groups, grpo)
    assert [r.advantage[0] for r in groups[0].rollouts] == pytest.approx([0.25, -0.75, 0.25, 0.25])


def teacher_forced(model, prompt_ids, completion_ids):
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), with_entropy=False)
    return lp[0, len(prompt_ids) - 1:]


def test_groups_split_over_contexts_on_the_tiny_model(tiny):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tok.eos_token_id,))
    encode = lambda p: tok(p.text)["input_ids"]  # noqa: E731
    x = Prompt("x", "12+3=", token_ids=tok("12+3=")["input_ids"])
    nudge = NudgeConfig(contexts=["go", "", "slow", "fast"], template="{hint}:{prompt}")
    sampler = NudgeSampler(params, lambda ids: "", nudge=nudge, encode=encode)
    (g,), metrics = sampler.generate(SlotEngine(model, pad_token_id=tok.pad_token_id), [x], [6], seed=3)
    assert [r.context for r in g.rollouts] == ["go", "go", None, None, "slow", "fast"]  # 6 over 4: 2, 2, 1, 1
    assert metrics["nudge/contexts"] == 4
    for r in g.rollouts:
        assert r.prompt_ids == x.token_ids  # trained on x
        under = tok(f"{r.context}:12+3=")["input_ids"] if r.context else x.token_ids
        assert torch.allclose(torch.tensor(r.behavior_logprobs), teacher_forced(model, under, r.completion_ids),
                              atol=1e-4)


def test_one_empty_context_samples_as_group(tiny):
    """K = 1, context '': the same rollouts as GroupSampler (same seeds), no context recorded."""
    model, tok = tiny
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(tok.eos_token_id,))
    x = Prompt("x", "7+8=", token_ids=tok("7+8=")["input_ids"])
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id)
    nudged, _ = NudgeSampler(params, lambda ids: "", nudge=NudgeConfig(contexts=[""]),
                             encode=lambda p: tok(p.text)["input_ids"]).generate(engine, [x], [4], seed=5)
    plain, _ = GroupSampler(params, lambda ids: "").generate(engine, [x], [4], seed=5)
    assert [r.completion_ids for r in nudged[0].rollouts] == [r.completion_ids for r in plain[0].rollouts]
    assert all(r.context is None for r in nudged[0].rollouts)
