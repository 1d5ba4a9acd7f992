"""``vcpo`` (optim/vcpo.py): ESS-scaled learning rate and the minimum-variance baseline.

METHODS.md's test idea: w = [1, 1, 2] → ESS = 2.667; with r = [0, 1, 1], b* = .833.
"""

import math

import pytest
import torch

from rollwise.optim.objective import ObjectiveConfig, assign_advantages
from rollwise.optim.vcpo import (
    assign_vcpo,
    min_variance_baselines,
    normalised_ess,
    policy_log_ratios,
    scaled_lr,
    sequence_weights,
)
from rollwise.types import Prompt, Rollout, RolloutGroup


def test_ess_and_baseline_by_hand():
    """ESS = (1 + 1 + 2)² / (1 + 1 + 4) = 16/6 = 2.667; b* = (0·1 + 1·1 + 1·4)/(1 + 1 + 4) = 5/6 = .833."""
    w = torch.tensor([1.0, 1.0, 2.0])
    assert normalised_ess(w) * 3 == pytest.approx(16 / 6)
    b = min_variance_baselines(w, torch.tensor([0.0, 1, 1]), torch.zeros(3, dtype=torch.long))
    assert b.tolist() == pytest.approx([5 / 6] * 3)


def test_baselines_are_per_group_and_weights_clamped():
    b = min_variance_baselines(torch.tensor([1.0, 3.0, 1.0, 1.0]), torch.tensor([1.0, 0, 1, 1]),
                               torch.tensor([0, 0, 1, 1]))
    assert b.tolist() == pytest.approx([0.1, 0.1, 1.0, 1.0])  # (1·1 + 9·0)/(1 + 9) = .1
    assert sequence_weights(torch.tensor([math.log(2), 9.0, -9.0])).tolist() == pytest.approx(
        [2.0, math.exp(5), math.exp(-5)])


def group(rewards, log_ratio=None):
    rollouts = [Rollout("p", [1, 2], [3, 4], [-1.0, -1.0], [0, 0], "stop", reward=r, score=r) for r in rewards]
    return RolloutGroup(Prompt("p", "x"), rollouts)


def test_it_differs_from_grpo_and_scales_the_lr():
    """w = [1, 1, 2] (log-ratios 0, 0, ln 2): A = r − .833 = [−.833, .167, .167]; GRPO: (r − 2/3)/.577."""
    g, grpo = group([0.0, 1.0, 1.0]), group([0.0, 1.0, 1.0])
    scale, metrics = assign_vcpo([g], torch.tensor([0.0, 0.0, math.log(2)]))
    assert scale == pytest.approx(16 / 18) and metrics["vcpo/ess"] == pytest.approx(16 / 6)
    assign_advantages([g], ObjectiveConfig(method="vcpo"))
    assign_advantages([grpo], ObjectiveConfig(method="grpo"))
    assert [r.advantage[0] for r in g.rollouts] == pytest.approx([-5 / 6, 1 / 6, 1 / 6])
    assert [r.advantage[0] for r in grpo.rollouts] == pytest.approx([-1.1547, 0.5774, 0.5774], abs=1e-4)


def test_on_policy_it_is_the_group_mean_and_the_full_lr():
    g = group([0.0, 1.0, 1.0, 1.0])
    scale, _ = assign_vcpo([g], torch.zeros(4))
    assert scale == pytest.approx(1.0)
    assert [r.value_baseline for r in g.rollouts] == pytest.approx([0.75] * 4)


def test_the_lr_is_scaled_for_the_update_only():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with scaled_lr(opt, 0.25):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    assert opt.param_groups[0]["lr"] == 0.1


def test_without_baselines_the_estimator_refuses():
    with pytest.raises(ValueError, match="value_baseline"):
        assign_advantages([group([0.0, 1.0])], ObjectiveConfig(method="vcpo"))


def test_log_ratios_of_the_tiny_model_against_perturbed_behaviour(tiny):
    """Behaviour log-probs = the model's own: Σ(ℓ^θ − ℓ^μ) = 0; each lowered by .5: the sum is +.5 per token."""
    from rollwise.model.logprobs import token_logprobs_and_entropy

    model, tok = tiny
    prompt, completion = [5, 6, 7], [8, 9, 10]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), with_entropy=False)
    own = lp[0, 2:5].tolist()
    exact = Rollout("p", prompt, completion, own, [0] * 3, "stop")
    shifted = Rollout("p", prompt, completion, [x - 0.5 for x in own], [0] * 3, "stop")
    out = policy_log_ratios(model, [RolloutGroup(Prompt("p", "x"), [exact, shifted])], {}, tok.pad_token_id)
    assert out.tolist() == pytest.approx([0.0, 1.5], abs=1e-4)


def test_a_run_logs_ess_every_step(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "objective.method=vcpo",
                 "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=8",
                 "train.eval_samples=0", "model.threads=1", "train.steps=1", "train.eval_every=0",
                 "train.checkpoint_every=0"]
    trainer = Trainer(load_run_config(None, overrides))
    trainer.prepare()
    metrics = trainer.step()
    assert metrics["vcpo/lr_scale"] == pytest.approx(1.0, abs=1e-3)  # sync, in-process: on-policy
    assert metrics["vcpo/ess"] == pytest.approx(4.0, abs=1e-2)


def test_vcpo_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    arms = default_arms()
    assert "objective:vcpo" in arms and "objective:vcpo@async1" in arms
    assert arm_lines("objective:vcpo") == ["objective.method=vcpo"]
