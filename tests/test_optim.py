"""Optimize stage, tier 1: advantages, clipped loss, aggregation, KL and TrainBatch by hand.

Every expected number is worked out in a comment next to it (METHODS.md: grpo, dr_grpo,
dapo_clip_higher, kl_estimators).
"""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollwise.optim.advantages import (
    drpo_advantages,
    group_advantages,
    group_stats,
    median_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rollwise.optim.batch import build_batch
from rollwise.optim.losses import aggregate, kl_penalty, ppo_clip_loss
from rollwise.types import Prompt, Rollout, RolloutGroup


def one_group(n):
    return torch.zeros(n, dtype=torch.long)


# -- advantages ---------------------------------------------------------------------------


def test_grpo_two_of_four():
    # mean = .5; deviations ±.5; Bessel var = 4·.25/3 = 1/3; std = .5774
    # A = ±.5/.5774 = ±.8660 (the +1e-6 in the denominator moves the 6th decimal)
    rewards = torch.tensor([1.0, 0, 0, 1])
    mean, std = group_stats(rewards, one_group(4))  # statistics come back in float64
    assert mean.dtype == std.dtype == torch.float64
    assert torch.allclose(mean, torch.full((4,), 0.5, dtype=torch.float64))
    assert torch.allclose(std, torch.full((4,), 1 / math.sqrt(3), dtype=torch.float64))
    adv = group_advantages(rewards, one_group(4))
    assert torch.allclose(adv, torch.tensor([0.8660, -0.8660, -0.8660, 0.8660]), atol=1e-4)


def test_grpo_one_of_four():
    # mean = .25; deviations .75, −.25 ×3; Bessel var = (.5625 + 3·.0625)/3 = .25; std = .5
    # A = .75/.5 = 1.5 and −.25/.5 = −.5
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), one_group(4))
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_dr_grpo_no_scaling():
    # mean-centring only: [1, 0, 0, 0] − .25
    adv = group_advantages(torch.tensor([1.0, 0, 0, 0]), one_group(4), scale_rewards="none")
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_batch_scaling_over_two_groups():
    # groups [1, 0] and [1, 1]: group means .5 and 1 → centred [.5, −.5, 0, 0]
    # batch std of raw rewards [1, 0, 1, 1] (TRL's scale_rewards="batch"): mean .75,
    # squared deviations .0625 + .5625 + .0625 + .0625 = .75, Bessel var .75/3 = .25, std .5
    # → A = [1, −1, 0, 0]. (Group scaling would give [.7071, −.7071, 0, 0].)
    rewards = torch.tensor([1.0, 0, 1, 1])
    groups = torch.tensor([0, 0, 1, 1])
    adv = group_advantages(rewards, groups, scale_rewards="batch")
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0]), atol=1e-5)
    adv_group = group_advantages(rewards, groups, scale_rewards="group")
    assert torch.allclose(adv_group, torch.tensor([0.7071, -0.7071, 0.0, 0.0]), atol=1e-4)


def test_interleaved_groups():
    # group 7 at positions 0, 2, 4 has rewards [1, 0, 0]; group 3 at 1, 3, 5 has [0, 1, 0].
    # Each: mean 1/3, deviations 2/3, −1/3, −1/3; Bessel var = (4/9 + 1/9 + 1/9)/2 = 1/3;
    # std = .5774 → A = (2/3)/.5774 = 1.1547 and (−1/3)/.5774 = −.5774
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 0])
    groups = torch.tensor([7, 3, 7, 3, 7, 3])
    adv = group_advantages(rewards, groups)
    hi, lo = 2 / math.sqrt(3), -1 / math.sqrt(3)
    assert torch.allclose(adv, torch.tensor([hi, lo, lo, hi, lo, lo]), atol=1e-4)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_of_one_gets_zero(scale):
    # a singleton group: r − mean = 0 (its std is 0, so 0/(0 + 1e-6) = 0, not NaN)
    adv = group_advantages(torch.tensor([1.0]), one_group(1), scale_rewards=scale)
    assert adv.tolist() == [0.0]
    # beside a real group: the singleton (group 1) still gets 0
    adv = group_advantages(torch.tensor([1.0, 0.7, 0.0]), torch.tensor([0, 1, 0]), scale_rewards=scale)
    assert adv[1].item() == 0.0 and not torch.isnan(adv).any()


def test_unknown_scale_rewards():
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(torch.tensor([1.0, 0]), one_group(2), scale_rewards="grouped")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=24),
    st.sampled_from(["group", "batch", "none"]),
)
@example([(0, 3.0034791813909303)] * 3, "group")  # found by a CI run: −4.4e-10 each before the float64 fix
def test_advantages_sum_to_zero_per_group(samples, scale):
    # float64 so the invariant is checked on the math, not on float32 rounding
    groups = torch.tensor([g for g, _ in samples])
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    adv = group_advantages(rewards, groups, scale_rewards=scale)
    assert torch.isfinite(adv).all()
    for g in groups.unique():
        part = adv[groups == g]
        assert abs(part.sum().item()) <= 1e-9 * (1 + part.abs().sum().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("value,n", [(0.7, 8), (3.0034791813909303, 3), (1 / 3, 7), (-2.1, 5), (1e4 + 0.1, 6)])
def test_zero_variance_group_gets_exactly_zero(dtype, scale, value, n):
    # before: float32 0.7 × 8 gave 0.056 per rollout (the mean's rounding error / (0 + 1e-6))
    rewards = torch.tensor([value] * n + [1.0, 0.0], dtype=dtype)  # a flat group beside a mixed one
    groups = torch.tensor([0] * n + [1, 1])
    adv = group_advantages(rewards, groups, scale_rewards=scale)
    assert adv.dtype == dtype
    assert adv[:n].tolist() == [0.0] * n
    assert adv[n] > 0 > adv[n + 1]


@pytest.mark.parametrize("value,n", [(0.7, 8), (3.0034791813909303, 3), (1 / 3, 7)])
def test_zero_variance_group_every_estimator(value, n):
    rewards = torch.tensor([value] * n, dtype=torch.float32)
    groups = one_group(n)
    assert rloo_advantages(rewards, groups).tolist() == [0.0] * n
    assert median_advantages(rewards, groups)[0].tolist() == [0.0] * n
    # REINFORCE++ whitens over the batch: a flat group's centred values are exactly 0 before that
    mixed = torch.cat([rewards, torch.tensor([1.0, 0.0])])
    adv = reinforce_pp_advantages(mixed, torch.tensor([0] * n + [1, 1]), torch.ones(n + 2))
    assert len(set(adv[:n].tolist())) == 1  # one value for the whole flat group (−μ/σ of the batch)


def test_drpo_empty_correct_completion_is_finite():
    # before: lengths [0, 5, 7] with only the empty one correct gave [nan, −⅓, −⅓]
    # p = ⅓: wrong ones −⅓; the single correct one takes (1 − p)·|P|·softmax = ⅔ · 1 · 1
    adv = drpo_advantages(torch.tensor([True, False, False]), torch.tensor([0.0, 5, 7]), one_group(3))
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # two empty correct ones share the positive mass equally (mean length 0: no length preference):
    # p = ⅔, each correct one (1 − ⅔)·2·½ = ⅓, the wrong one −⅔
    adv = drpo_advantages(torch.tensor([True, True, False]), torch.tensor([0.0, 0, 7]), one_group(3))
    assert adv.tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    assert abs(float(adv.sum())) < 1e-9


def test_drpo_all_correct_or_all_wrong_is_zero():
    adv = drpo_advantages(torch.tensor([True] * 3 + [False] * 3), torch.tensor([1.0, 2, 3, 1, 2, 3]),
                          torch.tensor([0, 0, 0, 1, 1, 1]))
    assert adv.tolist() == [0.0] * 6


# -- clipped loss and aggregation ---------------------------------------------------------


def clip_case():
    """2×3 case, ε = .2. Row 0 has A = +1, row 1 has A = −1; row 1's last column is padding.

    ρ = [[1.0, 1.5, 0.5], [0.5, 1.1, 0.25]], built as ℓ^θ = ℓ^old + log ρ with ℓ^old = −1.
    """
    ratio = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.1, 0.25]])
    old = torch.full((2, 3), -1.0)
    policy = old + ratio.log()
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    return policy, old, advantages, mask


def test_ppo_clip_per_token_by_hand():
    policy, old, advantages, mask = clip_case()
    per_token, metrics = ppo_clip_loss(policy, old, advantages, mask, epsilon=0.2)
    # L = −min(ρA, clip(ρ, .8, 1.2)·A)
    # row 0, A = +1: ρ=1   → −min(1, 1)     = −1
    #                ρ=1.5 → −min(1.5, 1.2) = −1.2   (clipped high: no gradient)
    #                ρ=.5  → −min(.5, .8)   = −.5    (not clipped: the min keeps ρA)
    # row 1, A = −1: ρ=.5  → −min(−.5, −.8) = .8     (clipped low)
    #                ρ=1.1 → −min(−1.1, −1.1) = 1.1
    #                ρ=.25 → −min(−.25, −.8) = .8    (padding: would be clipped low, but masked)
    expected = torch.tensor([[-1.0, -1.2, -0.5], [0.8, 1.1, 0.8]])
    assert torch.allclose(per_token, expected, atol=1e-6)
    # clip ratios over the 5 unmasked tokens: one high (row 0 col 1), one low (row 1 col 0);
    # the padded row-1 ρ = .25 does not count
    assert metrics["clip_ratio/high"].item() == pytest.approx(1 / 5)
    assert metrics["clip_ratio/low"].item() == pytest.approx(1 / 5)


def test_ppo_clip_per_token_advantages_match_per_sequence():
    policy, old, advantages, mask = clip_case()
    per_seq, _ = ppo_clip_loss(policy, old, advantages, mask)
    per_tok, _ = ppo_clip_loss(policy, old, advantages[:, None].expand(2, 3), mask)
    assert torch.equal(per_seq, per_tok)


def test_loss_agg_modes_by_hand():
    policy, old, advantages, mask = clip_case()
    per_token, _ = ppo_clip_loss(policy, old, advantages, mask, epsilon=0.2)
    # unmasked values: row 0 [−1, −1.2, −.5] (sum −2.7), row 1 [.8, 1.1] (sum 1.9); total −.8
    # token_mean: −.8 / 5 = −.16
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(-0.16, abs=1e-6)
    # seq_mean_token_mean: mean(−2.7/3, 1.9/2) = mean(−.9, .95) = .025
    assert aggregate(per_token, mask, "seq_mean_token_mean").item() == pytest.approx(0.025, abs=1e-6)
    # seq_mean_token_sum_norm: −.8 / (B·T) = −.8/6 = −.1333; with max_len 4: −.8/8 = −.1
    assert aggregate(per_token, mask, "seq_mean_token_sum_norm").item() == pytest.approx(-0.8 / 6, abs=1e-6)
    assert aggregate(per_token, mask, "seq_mean_token_sum_norm", max_len=4).item() == pytest.approx(-0.1, abs=1e-6)
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(per_token, mask, "sequence_mean")


def test_aggregate_all_masked_is_zero_not_nan():
    per_token = torch.ones(2, 3)
    mask = torch.zeros(2, 3)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert aggregate(per_token, mask, mode).item() == 0.0


@pytest.mark.parametrize("eps_high,expected_grad", [(0.2, 0.0), (0.28, -1.25)])
def test_dapo_clip_higher_gradient(eps_high, expected_grad):
    # A = 1, ρ = 1.25. ε_hi = .2: min(1.25, 1.2) picks the clipped constant → dL/dℓ^θ = 0.
    # ε_hi = .28: 1.25 is inside [.8, 1.28], L = −ρ·A, dL/dℓ^θ = −ρ = −1.25.
    old = torch.tensor([[-1.0]])
    policy = (old + math.log(1.25)).requires_grad_(True)
    per_token, _ = ppo_clip_loss(policy, old, torch.tensor([1.0]), torch.ones(1, 1), epsilon=0.2, epsilon_high=eps_high)
    per_token.sum().backward()
    assert policy.grad.item() == pytest.approx(expected_grad, abs=1e-6)
    assert per_token.item() == pytest.approx(-min(1.25, 1 + eps_high), abs=1e-6)


# -- KL estimators ------------------------------------------------------------------------


def test_kl_estimators_single_token():
    # ℓ^θ = −1, ℓ^ref = −2 → δ = ℓ^ref − ℓ^θ = −1
    # k1 = −δ = 1; k2 = δ²/2 = .5; k3 = e^δ − 1 − δ = e^−1 = .3679
    policy, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert kl_penalty(policy, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(policy, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(policy, ref, "k3").item() == pytest.approx(0.3679, abs=1e-4)
    with pytest.raises(ValueError, match="k1, k2 or k3"):
        kl_penalty(policy, ref, "k4")


def test_kl_estimators_exact_expectations():
    # π_θ = [.7, .3], π_ref = [.5, .5]; expectations under π_θ (weights .7, .3):
    # KL = .7·ln(1.4) + .3·ln(.6) = .23553 − .15325 = .0823
    # E[k1] = KL; E[k3] = E[π_ref/π_θ] − 1 + KL = (.5 + .5) − 1 + KL = KL = .0823
    # E[k2] = ½(.7·ln(1.4)² + .3·ln(.6)²) = ½(.07925 + .07828) = .0788
    p_theta = torch.tensor([[0.7, 0.3]], dtype=torch.float64)
    p_ref = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    kl = (p_theta * (p_theta / p_ref).log()).sum().item()
    expect = {}
    for k in ("k1", "k2", "k3"):
        expect[k] = (p_theta * kl_penalty(p_theta.log(), p_ref.log(), k)).sum().item()
    assert expect["k1"] == pytest.approx(kl) and expect["k3"] == pytest.approx(kl)
    assert round(expect["k1"], 4) == 0.0823 and round(expect["k3"], 4) == 0.0823
    assert round(expect["k2"], 4) == 0.0788


# -- TrainBatch ---------------------------------------------------------------------------

PAD = 0


def rollout(prompt_ids, completion_ids, finish, adv, logprobs=None):
    logprobs = logprobs or [-0.1 * (i + 1) for i in range(len(completion_ids))]
    return Rollout(
        prompt_id="p", prompt_ids=prompt_ids, completion_ids=completion_ids, behavior_logprobs=logprobs,
        versions=[0] * len(completion_ids), finish_reason=finish, reward=float(adv), advantage=[adv] * len(completion_ids),
    )


def two_groups():
    # a1: 3 prompt + 3 completion (stops); a2: 3 + 1 (truncated); b1: 2 + 4 (truncated). width 6.
    a1 = rollout([1, 5, 6], [7, 8, 2], "stop", 0.5, [-0.1, -0.2, -0.3])
    a2 = rollout([1, 5, 6], [9], "length", -0.5, [-0.4])
    b1 = rollout([1, 4], [3, 3, 3, 3], "length", 1.0)
    return [RolloutGroup(Prompt("a", "a"), [a1, a2]), RolloutGroup(Prompt("b", "b"), [b1])]


def test_build_batch_alignment_and_masks():
    batch = build_batch(two_groups(), pad_token_id=PAD)
    assert batch.input_ids.tolist() == [[1, 5, 6, 7, 8, 2], [1, 5, 6, 9, PAD, PAD], [1, 4, 3, 3, 3, 3]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0], [1] * 6]
    # column t scores input_ids[:, t+1]: the first completion token sits at p, so column p−1
    assert batch.completion_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert batch.loss_weights.tolist() == batch.completion_mask.tolist()  # no forced or shared tokens here
    assert torch.allclose(batch.behavior_logprobs[0], torch.tensor([0, 0, -0.1, -0.2, -0.3]))
    assert torch.allclose(batch.behavior_logprobs[1], torch.tensor([0, 0, -0.4, 0, 0]))
    assert batch.advantages[2].tolist() == [0, 1, 1, 1, 1]
    assert batch.advantages[1].tolist() == [0, 0, -0.5, 0, 0]
    for i, r in enumerate(r for g in two_groups() for r in g.rollouts):
        scored = batch.input_ids[i, 1:][batch.completion_mask[i].bool()]
        assert scored.tolist() == r.completion_ids
    assert batch.group_ids.tolist() == [0, 0, 1]
    assert batch.completion_lengths.tolist() == [3, 1, 4]
    assert batch.rewards.tolist() == [0.5, -0.5, 1.0]
    assert len(batch) == 3


def test_build_batch_mask_truncated():
    batch = build_batch(two_groups(), pad_token_id=PAD, mask_truncated=True)
    # a2 and b1 finished by "length": no gradient; a1 (stop) is untouched
    assert batch.loss_weights.tolist() == [[0, 0, 1, 1, 1], [0] * 5, [0] * 5]
    # they are still completions: the 0/1 mask and the lengths do not change
    assert batch.completion_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert batch.completion_lengths.tolist() == [3, 1, 4]
    # the data is still there (for logging); only the mask changes
    assert batch.advantages[2].tolist() == [0, 1, 1, 1, 1]


def test_build_batch_errors():
    groups = two_groups()
    groups[1].rollouts[0].advantage = None
    with pytest.raises(ValueError, match="no per-token advantage"):
        build_batch(groups, pad_token_id=PAD)
    groups[1].rollouts[0].advantage = [1.0]  # wrong length (4 completion tokens)
    with pytest.raises(ValueError, match="no per-token advantage"):
        build_batch(groups, pad_token_id=PAD)
    with pytest.raises(ValueError, match="no rollouts"):
        build_batch([], pad_token_id=PAD)


def test_select_trims_width():
    batch = build_batch(two_groups(), pad_token_id=PAD)
    sub = batch.select(torch.tensor([1]))  # a2 alone: 4 real tokens
    assert sub.input_ids.tolist() == [[1, 5, 6, 9]]
    assert sub.attention_mask.tolist() == [[1, 1, 1, 1]]
    assert sub.completion_mask.tolist() == [[0, 0, 1]] and sub.loss_weights.tolist() == [[0, 0, 1]]
    assert sub.behavior_logprobs.shape == sub.advantages.shape == (1, 3)
    assert sub.group_ids.tolist() == [0] and sub.completion_lengths.tolist() == [1]
    full = batch.select(slice(0, 2))  # a1 is 6 wide: nothing trimmed
    assert full.input_ids.shape == (2, 6) and full.completion_mask.shape == (2, 5)
