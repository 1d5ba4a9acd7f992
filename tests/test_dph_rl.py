"""``dph_rl`` (optim/dph.py): forward KL to the initial policy from a pool of its own samples.

METHODS.md's test idea: π_0 = [.5, .5], π_θ = [.7, .3] → KL(π_0‖π_θ) = .0872.
"""

import copy
import math

import pytest
import torch

from rollwise.optim.dph import Rehearsal, draw, extend_pool, forward_kl, rehearsal_nll
from rollwise.optim.objective import ObjectiveConfig
from rollwise.types import Prompt, Rollout, RolloutGroup


def test_forward_kl_by_hand():
    """.5·ln(.5/.7) + .5·ln(.5/.3) = .5·(−.3365) + .5·(.5108) = .0872."""
    assert forward_kl(torch.tensor([0.5, 0.5]), torch.tensor([0.7, 0.3])) == pytest.approx(0.0872, abs=1e-4)
    assert forward_kl(torch.tensor([0.5, 0.5]), torch.tensor([0.7, 0.3])) == pytest.approx(
        0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3))


def test_the_pool_term_has_the_gradient_of_forward_kl():
    """A categorical π_θ = softmax(z): the gradient of −E_{π_0}[log π_θ] equals that of KL(π_0‖π_θ)
    (they differ by π_0's entropy, no θ in it); here E over π_0 is exact, both = π_θ − π_0."""
    p0 = torch.tensor([0.5, 0.5])
    z = torch.log(torch.tensor([0.7, 0.3])).requires_grad_()
    nll = -(p0 * torch.log_softmax(z, -1)).sum()
    (g_nll,) = torch.autograd.grad(nll, z)
    z2 = z.detach().clone().requires_grad_()
    kl = (p0 * (p0.log() - torch.log_softmax(z2, -1))).sum()
    (g_kl,) = torch.autograd.grad(kl, z2)
    assert torch.allclose(g_nll, g_kl) and g_kl.tolist() == pytest.approx([0.2, -0.2])
    assert float(kl.detach()) == pytest.approx(0.0872, abs=1e-4)


def rollout(versions, completion=(8, 9)):
    return Rollout("p", [5, 6, 7], list(completion), [-1.0] * len(completion), list(versions), "stop")


def test_the_pool_takes_version_zero_rollouts_only():
    pool = []
    g = RolloutGroup(Prompt("p", "x"), [rollout([0, 0]), rollout([0, 1]), rollout([1, 1]), rollout([0, 0], (4, 5))])
    extend_pool(pool, [g], 10)
    assert pool == [([5, 6, 7], [8, 9]), ([5, 6, 7], [4, 5])]
    extend_pool(pool, [g], 3)
    assert len(pool) == 3
    assert draw(list(range(10)), 4, seed=1) == draw(list(range(10)), 4, seed=1)


def mean_logprob(model, tok, items):
    """The pool completion's mean token log-prob, measured apart from the code under test."""
    from rollwise.optim.old_logits import completion_logprobs

    (p, c), = items
    lp = completion_logprobs(model, [Rollout("p", p, c, [0.0] * len(c), [0] * len(c), "stop")], {}, tok.pad_token_id)
    return sum(lp[0]) / len(c)


def test_rehearsal_raises_the_pool_likelihood_where_grpo_does_nothing(tiny):
    """A batch without signal (all advantages 0): GRPO's step leaves the weights; the rehearsal step raises the
    pool completion's length-normalised log-likelihood, and logs its NLL before the step."""
    model, tok = tiny
    items = [([5, 6, 7], [8, 9, 10])]
    before = mean_logprob(model, tok, items)
    m = copy.deepcopy(model)
    opt = Rehearsal(torch.optim.SGD(m.parameters(), lr=1e-3), m, items, 1.0, {}, tok.pad_token_id)
    opt.zero_grad()
    opt.step()
    assert mean_logprob(m, tok, items) > before
    assert opt.metrics()["dph/rehearsal_nll"] == pytest.approx(-before, abs=1e-5)
    plain = copy.deepcopy(model)
    sgd = torch.optim.SGD(plain.parameters(), lr=1e-3)
    for p in plain.parameters():
        p.grad = torch.zeros_like(p)
    sgd.step()
    assert mean_logprob(plain, tok, items) == pytest.approx(before)


def test_the_preset_loads_no_reference():
    cfg = ObjectiveConfig(method="dph_rl")
    assert cfg.dph_coef == 0.05 and not cfg.needs_reference and cfg.beta == 0
    assert ObjectiveConfig().dph_coef == 0


def test_a_run_rehearses(tmp_path):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    overrides = [f"output_dir={tmp_path}", "task.max_digits=1", "task.eval_size=4", "objective.method=dph_rl",
                 "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=8",
                 "train.eval_samples=0", "model.threads=1", "train.steps=2", "train.eval_every=0",
                 "train.checkpoint_every=0", "objective.dph_pool=3"]
    trainer = Trainer(load_run_config(None, overrides))
    trainer.prepare()
    first = trainer.step()
    second = trainer.step()
    assert first["dph/pool"] == 3 and second["dph/pool"] == 3  # filled by step 0's rollouts (version 0)
    assert first["dph/rehearsal_nll"] > 0


def test_dph_rl_is_a_ledger_arm():
    from rollwise.bench.ablate import arm_lines, default_arms

    assert "objective:dph_rl" in default_arms()
    assert arm_lines("objective:dph_rl") == ["objective.method=dph_rl"]
