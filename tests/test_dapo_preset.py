"""``objective.method: dapo`` is the whole method (issue 22, "Method defaults").

METHODS.md defines DAPO as clip-higher + token-mean + overlong shaping + dynamic sampling +
truncated-completion masking. Before, the ``dapo`` preset turned on the first three only (it
was the same dict as ``dapo_clip_higher``): a "dapo" arm trained every flat group and every
truncated completion. Now ``dapo`` also sets ``objective.mask_truncated_completions`` and the
run config fills ``control.method: dynamic_sampling``; what a recipe sets explicitly wins, and
``dapo_clip_higher`` stays the partial one.
"""

import pytest
import torch

from rollwise.control import build_controller
from rollwise.optim.batch import build_batch
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import PRESETS, assign_advantages, policy_loss
from rollwise.train.config import load_run_config
from rollwise.types import Prompt, Rollout, RolloutGroup


def cfg(*sets):
    return load_run_config(None, list(sets))


def test_dapo_is_the_whole_method():
    c = cfg("objective.method=dapo")
    o = c.objective
    assert (o.epsilon, o.epsilon_high, o.loss_agg, o.overlong_shaping) == (0.2, 0.28, "token_mean", True)
    assert o.mask_truncated_completions and o.beta == 0
    assert c.control.method == "dynamic_sampling"


def test_dapo_clip_higher_is_the_partial_one():
    c = cfg("objective.method=dapo_clip_higher")
    o = c.objective
    assert (o.epsilon_high, o.loss_agg, o.overlong_shaping) == (0.28, "token_mean", True)
    assert not o.mask_truncated_completions and c.control.method == "none"
    assert PRESETS["dapo"] != PRESETS["dapo_clip_higher"]  # before: the same dict


def test_explicit_settings_win_over_the_preset():
    assert cfg("objective.method=dapo", "control.method=none").control.method == "none"
    assert cfg("objective.method=dapo", "control.method=xrpo_alloc").control.method == "xrpo_alloc"
    unmasked = cfg("objective.method=dapo", "objective.mask_truncated_completions=false")
    assert not unmasked.objective.mask_truncated_completions
    c = cfg("objective.method=dapo", "control.dynamic_sampling.max_rounds=1")  # options alone keep the method
    assert c.control.method == "dynamic_sampling" and c.control.dynamic_sampling.max_rounds == 1
    assert cfg("control.method=dynamic_sampling").objective.method == "grpo"  # control alone changes no objective


# -- on a mixed batch, dapo differs from the baseline --------------------------------------------
def rollout(rewards_i, reward, finish="stop", n=4):
    return Rollout("p", [1, 2], [5 + rewards_i] * n, [-0.5] * n, [0] * n, finish, reward=reward, score=reward)


def mixed_groups():
    # p0 mixed, one of its correct rollouts truncated; p1 all correct (flat); p2 mixed, nothing truncated
    return [RolloutGroup(Prompt("p0", "x"), [rollout(0, 1.0, "length"), rollout(1, 1.0), rollout(2, 0.0),
                                              rollout(3, 0.0)]),
            RolloutGroup(Prompt("p1", "x"), [rollout(i, 1.0) for i in range(4)]),
            RolloutGroup(Prompt("p2", "x"), [rollout(i, float(i % 2)) for i in range(4)])]


@pytest.mark.parametrize("baseline", ["objective.method=dapo_clip_higher", "objective.method=grpo"])
def test_dapo_drops_flat_groups_the_baseline_keeps(baseline):
    dapo, base = cfg("objective.method=dapo"), cfg(baseline)
    accepted = {}
    for name, c in (("dapo", dapo), ("base", base)):
        controller = build_controller(c.control, c.rollout, seed=0)
        accepted[name] = [g.prompt.id for g in mixed_groups() if controller.accept(g)]
    assert accepted == {"dapo": ["p0", "p2"], "base": ["p0", "p1", "p2"]}


def _loss(objective, groups):
    assign_advantages(groups, objective)
    batch = build_batch(groups, pad_token_id=0, mask_truncated=objective.mask_truncated_completions)
    lp = batch.behavior_logprobs.clone().requires_grad_(True)
    lw = token_weights(batch.loss_weights, objective.loss_agg, 16, lengths=batch.completion_lengths)
    loss, _ = policy_loss(lp, lp.detach(), batch.advantages, batch.trained_mask, lw, objective)
    loss.backward()
    return batch, lp.grad


def test_dapo_masks_truncated_completions_from_the_loss():
    dapo, partial = cfg("objective.method=dapo").objective, cfg("objective.method=dapo_clip_higher").objective
    batch, grad = _loss(dapo, mixed_groups())
    _, grad_partial = _loss(partial, mixed_groups())
    truncated = 0  # the first rollout of p0 hit max_new_tokens without EOS
    assert batch.trained_mask[truncated].sum() == 0 and grad[truncated].abs().sum() == 0
    assert grad_partial[truncated].abs().sum() > 0  # the partial preset still trains it
    assert batch.trained_mask[1:].sum() == batch.completion_mask[1:].sum()  # every other token is trained
    assert not torch.allclose(grad, grad_partial)


def test_the_trainer_runs_dapo_with_dynamic_sampling(tmp_path):
    from rollwise.train.loop import Trainer

    with Trainer(cfg(f"output_dir={tmp_path}", "model.threads=1", "objective.method=dapo")) as t:
        assert t.controller.name == "dynamic_sampling" and t.controller.refills_dropped_groups
