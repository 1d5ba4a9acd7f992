"""The objective zoo: hand-computed cases per method id (numbers worked out in comments),
gradients against autograd where a method defines its own, and a 20-step smoke run each."""

import math

import pytest
import torch

from rollwise.optim.advantages import drpo_advantages, median_advantages, reinforce_pp_advantages, rloo_advantages
from rollwise.optim.losses import (
    cispo_loss,
    clipped_surrogate,
    entropy_mask,
    importance_ratio,
    prefix_min_ratio,
    sapo_loss,
)
from rollwise.optim.objective import PRESETS, ObjectiveConfig, assign_advantages, policy_loss
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.types import Prompt, Rollout, RolloutGroup

G0 = torch.zeros(4, dtype=torch.long)


# -- advantage estimators ---------------------------------------------------------------------
def test_rloo():
    # [1, 0, 0, 0]: 1 − mean(0, 0, 0) = 1; 0 − mean(1, 0, 0) = −1/3
    assert rloo_advantages(torch.tensor([1.0, 0, 0, 0]), G0).tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])
    # a group of one has no baseline to leave out: 0
    assert rloo_advantages(torch.tensor([1.0]), torch.zeros(1, dtype=torch.long)).tolist() == [0.0]


def test_reinforce_pp_baseline():
    # groups [1, 0] and [1, 1], one token each: centred [.5, −.5, 0, 0]; token mean 0,
    # Bessel std sqrt((.25 + .25) / 3) = .4082 → [1.2247, −1.2247, 0, 0]
    adv = reinforce_pp_advantages(torch.tensor([1.0, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), torch.ones(4))
    assert adv.tolist() == pytest.approx([1.2247, -1.2247, 0, 0], abs=1e-4)
    # whitening counts tokens: a 3-token rollout weighs three times
    long = reinforce_pp_advantages(torch.tensor([1.0, 0]), torch.tensor([0, 0]), torch.tensor([3.0, 1.0]))
    # centred [.5, −.5]; token mean (1.5 − .5)/4 = .25; var (3·.0625 + .5625)/3 = .25 → std .5
    assert long.tolist() == pytest.approx([0.5, -1.5], abs=1e-4)


def test_mc_grpo_median_pivot_gets_no_gradient():
    # [.2, .9, .4]: median .4 → [−.2, .5, 0], the .4 sample is the pivot (a mean baseline would give it −.1)
    adv, pivot = median_advantages(torch.tensor([0.2, 0.9, 0.4]), torch.zeros(3, dtype=torch.long))
    assert adv.tolist() == pytest.approx([-0.2, 0.5, 0.0]) and pivot.tolist() == [False, False, True]
    groups = [group([0.2, 0.9, 0.4]), group([1.0, 1.0, 0.0])]
    assign_advantages(groups, ObjectiveConfig(method="mc_grpo"))
    masks = [r.loss_weights for g in groups for r in g.rollouts]
    assert sum(m is not None and not any(m) for m in masks) == 2  # exactly one pivot per group: G rows train
    # second group [1, 1, 0]: median 1, the first 1 is the pivot
    assert [r.advantage[0] for r in groups[1].rollouts] == pytest.approx([0.0, 0.0, -1.0])


def test_drpo():
    # correct lengths [100, 300] + one wrong: p = 2/3; softmax(−[.5, 1.5]) = [.7311, .2689];
    # positives (1/3)·2·that = [.4874, .1793], the wrong one −.6667; Σ = 0
    adv = drpo_advantages(torch.tensor([1.0, 1, 0]), torch.tensor([100.0, 300, 50]), torch.zeros(3, dtype=torch.long))
    assert adv.tolist() == pytest.approx([0.4874, 0.1793, -0.6667], abs=1e-4)
    assert float(adv.sum()) == pytest.approx(0, abs=1e-9) and (adv[:2] > 0).all()


# -- ratio forms and losses ---------------------------------------------------------------------
def test_gspo_sequence_ratio_is_the_length_normalised_sequence_ratio():
    # log-ratios [.1, −.1, .3]: mean .1 → s = e^.1 = 1.1052 on every token; a padded 4th token does not count
    lp = torch.tensor([[0.1, -0.1, 0.3, 5.0]], requires_grad=True)
    old, mask = torch.zeros(1, 4), torch.tensor([[1.0, 1, 1, 0]])
    s = importance_ratio(lp, old, mask, "sequence")
    assert s[0, :3].tolist() == pytest.approx([math.exp(0.1)] * 3)
    # clipped for A > 0 at GSPO's ε_high = 4e-4: the loss is constant (no gradient)
    loss, _ = clipped_surrogate(s, torch.tensor([1.0]), mask, epsilon=3e-4, epsilon_high=4e-4)
    (loss[0, :3].sum()).backward()
    assert lp.grad.abs().sum() == 0
    # GSPO-token: same value, per-token gradient sg(s)·∇ℓ_t
    lp2 = lp.detach().clone().requires_grad_(True)
    st = importance_ratio(lp2, old, mask, "sequence_token")
    assert st[0, :3].tolist() == pytest.approx([math.exp(0.1)] * 3)
    st[0, 0].backward()
    assert lp2.grad[0].tolist() == pytest.approx([math.exp(0.1), 0, 0, 0], abs=1e-6)


def test_ppo_and_dual_clip():
    one = torch.ones(1, 1)
    # A = 1, ρ = 1.5: L = −min(1.5, 1.2) = −1.2 with zero gradient
    r = torch.tensor([[1.5]], requires_grad=True)
    loss, _ = clipped_surrogate(r, torch.tensor([1.0]), one)
    loss.sum().backward()
    assert float(loss.detach()) == pytest.approx(-1.2) and float(r.grad) == 0
    # A = −1, ρ = 5: PPO gives −min(−5, −1.2) = 5; dual clip c = 3 bounds it to −c·A = 3
    assert float(clipped_surrogate(torch.tensor([[5.0]]), torch.tensor([-1.0]), one)[0]) == pytest.approx(5)
    assert float(clipped_surrogate(torch.tensor([[5.0]]), torch.tensor([-1.0]), one, dual_clip=3)[0]) == pytest.approx(3)


def test_dapo_clip_higher_keeps_a_gradient_at_1_25():
    # A = 1, ρ = 1.25: clipped (no gradient) at ε_high = .2, inside the band (gradient 1) at .28
    for eps_high, grad in ((0.2, 0.0), (0.28, 1.0)):
        r = torch.tensor([[1.25]], requires_grad=True)
        clipped_surrogate(r, torch.tensor([1.0]), torch.ones(1, 1), epsilon_high=eps_high)[0].sum().backward()
        assert float(r.grad) == pytest.approx(-grad)


def test_cispo_gradient_is_the_clipped_weight():
    # A = 1, ρ = 1.5, ε_high = .28: L = −sg(1.28)·ℓ → dL/dℓ = −1.28 (PPO-clip would give 0)
    lp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    ratio = importance_ratio(lp, torch.zeros(1, 1), torch.ones(1, 1))
    loss, _ = cispo_loss(ratio, lp, torch.tensor([1.0]), torch.ones(1, 1), epsilon_high=0.28)
    loss.sum().backward()
    assert float(lp.grad) == pytest.approx(-1.28)


def test_sapo_gate_weight():
    # f(ρ) = (4/τ)σ(τ(ρ−1)); dL/dρ = −4σ(1−σ)·A: 1 at ρ = 1, 4·σ(1)·σ(−1) = .7864 at ρ = 2 (τ = 1)
    for rho, want in ((1.0, 1.0), (2.0, 0.7864)):
        r = torch.tensor([[rho]], requires_grad=True)
        sapo_loss(r, torch.tensor([1.0]), torch.ones(1, 1), tau_pos=1.0)[0].sum().backward()
        assert float(-r.grad) == pytest.approx(want, abs=1e-4)


def test_minpro_prefix_min_ratio():
    # ρ = [1.2, .8, 1.5, .9] → m = [1, 1.2, .8, .8]; prompt/padding columns do not count
    m = prefix_min_ratio(torch.tensor([[9.0, 1.2, 0.8, 1.5, 0.9]]), torch.tensor([[0.0, 1, 1, 1, 1]]))
    assert m[0, 1:].tolist() == pytest.approx([1, 1.2, 0.8, 0.8])
    assert float(prefix_min_ratio(torch.tensor([[3.0, 3.0]]), torch.ones(1, 2))[0, 1]) == 2.0  # capped at 2


def test_top_entropy_quantile_keeps_exactly_the_top_share():
    # 10 distinct entropies, q = .2 → exactly 2 kept (the two largest)
    ent = torch.arange(10.0).view(1, 10)
    keep = entropy_mask(ent, torch.ones(1, 10), 0.2)
    assert keep.sum() == 2 and keep[0, 8:].tolist() == [1, 1]


def test_kl_in_reward_moves_the_advantage():
    cfg = ObjectiveConfig(beta=0.5, kl_in="reward", tis_mode="none")
    lp = torch.tensor([[-1.0]], requires_grad=True)
    # k1 = ℓ^θ − ℓ^ref = −1 − (−2) = 1 → A' = 1 − .5·1 = .5; the loss is −ρ·A' = −.5 at ρ = 1
    loss, m = policy_loss(lp, lp.detach(), torch.tensor([[1.0]]), torch.ones(1, 1), torch.ones(1, 1), cfg,
                          ref_logprobs=torch.tensor([[-2.0]]))
    assert float(loss) == pytest.approx(-0.5) and float(m["kl"]) == pytest.approx(1.0)


def test_presets_fill_only_what_a_recipe_leaves_unset():
    gspo = ObjectiveConfig(method="gspo")
    assert (gspo.importance_sampling_level, gspo.epsilon, gspo.epsilon_high) == ("sequence", 3e-4, 4e-4)
    assert ObjectiveConfig(method="gspo", epsilon=0.1).epsilon == 0.1
    assert ObjectiveConfig(method="dapo").overlong_shaping and ObjectiveConfig(method="dapo").epsilon_high == 0.28
    assert ObjectiveConfig(method="ace").needs_reference and not ObjectiveConfig().needs_reference


def group(rewards, lengths=None):
    lengths = lengths or [2] * len(rewards)
    rollouts = [Rollout(prompt_id="p", prompt_ids=[1], completion_ids=[5] * n, behavior_logprobs=[-0.5] * n,
                        versions=[0] * n, finish_reason="stop", reward=r) for r, n in zip(rewards, lengths)]
    return RolloutGroup(prompt=Prompt(id="p", text="x", token_ids=[1]), rollouts=rollouts)


# -- every objective trains --------------------------------------------------------------------
SMOKE = ["task.max_digits=2", "task.eval_size=4", "rollout.prompts_per_step=8", "rollout.num_generations=4",
         "rollout.max_new_tokens=24", "train.eval_samples=0", "optim.micro_batch_size=32", "model.threads=1",
         "sft.steps=60", "optim.lr=1e-4"]


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
    """One SFT warm start shared by every objective's run (2-digit arith, sampled reward ~.3)."""
    out = tmp_path_factory.mktemp("warm")
    trainer = Trainer(load_run_config(None, [f"output_dir={out}", "name=warm", *SMOKE, "sft.steps=400",
                                             "sft.batch_size=32", "train.steps=0"]))
    trainer.prepare()
    return trainer.run_dir / "init_model"


@pytest.mark.slow
@pytest.mark.parametrize("method", list(PRESETS))
def test_every_objective_trains_20_steps_on_arith(tmp_path, method, warm_start):
    extra = ["rollout.num_generations=5"] if method == "mc_grpo" else []  # G + 1 with G even
    trainer = Trainer(load_run_config(None, [f"output_dir={tmp_path}", f"objective.method={method}", *SMOKE,
                                             f"model.path={warm_start}", "sft.steps=0", "rollout.prompts_per_step=16",
                                             "optim.lr=5e-5", *extra]))
    trainer.prepare()
    rewards = []
    for _ in range(20):
        m = trainer.step()
        assert all(v == v for v in m.values()), m  # no NaN
        rewards.append(m["reward/mean"] - m.get("reward/overlong", 0.0))  # the task's reward (dapo adds a length term)
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first > 0.1, (method, rewards)  # the warm start earns reward, so a collapse would show
    assert last >= 0.6 * first, (method, rewards)  # not collapsing (per-step means of 64 samples are noisy)
