"""``poise``: the cross-rollout baseline keeps the policy gradient unbiased (METHODS.md's bandit toy,
worked exactly), the baselines by hand, the probe learns, and a run trains with it."""

import itertools

import pytest
import torch

from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.poise import Probe, cross_baselines, poise_advantages, rollout_features
from rollwise.types import Prompt, Rollout, RolloutGroup


def _expected_gradient(baseline_of) -> torch.Tensor:
    """E[½ Σ_i A_i ∇θ log π(y_i)] over every pair (y_1, y_2) of a two-armed bandit at θ = 0
    (π = [.5, .5]), r(arm 0) = 1, r(arm 1) = 0, with A = r − b and b = ``baseline_of(values, group_ids)``;
    the value probe is perfect: V(y) = r(y), read from the sample's own "states"."""
    pi, reward = torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    grad = torch.zeros(2)
    for y1, y2 in itertools.product(range(2), repeat=2):
        arms = torch.tensor([y1, y2])
        rewards = values = reward[arms]
        adv = poise_advantages(rewards, baseline_of(values, torch.tensor([0, 0])))
        score = torch.nn.functional.one_hot(arms, 2).float() - pi  # ∇θ log softmax(θ)[y] = e_y − π
        grad += pi[y1] * pi[y2] * (adv[:, None] * score).mean(0)
    return grad


def test_the_cross_rollout_baseline_is_unbiased_and_the_own_value_is_not():
    """The true gradient of J = Σ π(a) r(a) at θ = 0 is [.25, −.25]."""
    true = torch.tensor([0.25, -0.25])
    cross = _expected_gradient(lambda v, g: cross_baselines(v, g, torch.zeros(len(v))))
    own = _expected_gradient(lambda v, g: v)  # a baseline computed from the sample itself
    assert torch.allclose(cross, true)
    assert torch.allclose(own, torch.zeros(2))  # r − V(y) = 0: the gradient vanishes — biased


def test_baselines_by_hand():
    values = torch.tensor([0.2, 0.6, 0.1, 0.5, 0.9, 0.7])
    groups = torch.tensor([0, 0, 1, 1, 1, 2])
    b = cross_baselines(values, groups, torch.full((6,), 0.3))
    # G = 2: each other's; G = 3: the mean of the other two; G = 1: the prompt probe's value
    assert torch.allclose(b, torch.tensor([0.6, 0.2, 0.7, 0.5, 0.3, 0.3]))


def test_the_probe_learns_a_separable_value():
    probe = Probe(hidden=8, buffer=100, steps=200, lr=0.05)
    assert torch.equal(probe.predict(torch.zeros(2, 3)), torch.full((2,), 0.5))  # untrained: V = .5
    x = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 2.0]]).repeat(20, 1)
    y = torch.tensor([0.0, 1.0]).repeat(20)
    probe.add(x, y)
    probe.fit()
    p = probe.predict(x[:2])
    assert p[0] < 0.2 and p[1] > 0.8
    clone = Probe(hidden=8, buffer=100, steps=200, lr=0.05)
    clone.load_state_dict(probe.state_dict())
    assert torch.equal(clone.predict(x[:2]), p)


def test_features_of_the_tiny_model(tiny):
    model, tok = tiny
    feats, prompt_feats = rollout_features(model, [([5, 6, 7], [8, 9]), ([5, 6], [])], tok.pad_token_id)
    d = model.config.hidden_size
    assert feats.shape == (2, 2 * d + 3) and prompt_feats.shape == (2, 2 * d)
    assert torch.equal(feats[1, -3:], torch.zeros(3))  # no completion: no entropies
    assert (feats[0, -3:] >= 0).all() and feats[0, -1] >= feats[0, -3]  # max >= mean


def _rollout(reward, baseline):
    r = Rollout("p", [1, 2], [3, 4], [-1.0, -1.0], [0, 0], "stop", reward=reward, score=reward)
    r.value_baseline = baseline
    return r


def test_poise_advantages_differ_from_grpo():
    groups = [RolloutGroup(Prompt("p", "x"), [_rollout(1.0, 0.25), _rollout(0.0, 0.75)])]
    assign_advantages(groups, ObjectiveConfig(method="poise"))
    assert [r.advantage[0] for r in groups[0].rollouts] == pytest.approx([0.75, -0.75])
    grpo = [RolloutGroup(Prompt("p", "x"), [_rollout(1.0, None), _rollout(0.0, None)])]
    assign_advantages(grpo, ObjectiveConfig(method="grpo"))
    assert [r.advantage[0] for r in grpo[0].rollouts] != pytest.approx([0.75, -0.75])
    with pytest.raises(ValueError, match="value_baseline"):
        assign_advantages(grpo, ObjectiveConfig(method="poise"))


def test_a_run_trains_with_poise_and_resumes_its_probe(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "objective.method=poise",
                 "rollout.prompts_per_step=3", "rollout.num_generations=2", "rollout.max_new_tokens=10",
                 "train.eval_samples=0", "model.threads=1", "train.steps=2", "train.eval_every=0",
                 "train.checkpoint_every=0", "objective.poise_steps=5"]
    trainer = Trainer(load_run_config(None, overrides))
    trainer.prepare()
    metrics = trainer.step()
    assert {"poise/value_abs_error", "poise/baseline_mean", "poise/forward_tokens"} <= set(metrics)
    assert metrics["poise/baseline_mean"] == pytest.approx(0.5)  # first step: the untrained probe's V = .5
    trainer.step()
    trainer.checkpoint()
    resumed = Trainer(load_run_config(None, overrides))
    resumed.prepare(resume=True)
    x = torch.randn(2, trainer.value_probe.rollouts.x.shape[1])
    assert torch.equal(resumed.value_probe.rollouts.predict(x), trainer.value_probe.rollouts.predict(x))


def test_poise_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    assert "objective:poise" in default_arms()
    assert arm_lines("objective:poise") == ["objective.method=poise"]
