"""Advantage shaping (ace, novelty_sharpen) and DAPO's soft overlong punishment, by hand.

Every expected number is worked out in a comment next to it (METHODS.md: ace,
novelty_sharpen, overlong_shaping).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.filter.overlong import overlong_penalty, overlong_reward
from rollwise.optim.shaping import ace, novelty_sharpen

# -- ace ----------------------------------------------------------------------------------


def test_ace_methods_case():
    # METHODS: A = [−1, −1], ĉ = [.5, −.2] → [−1.5, −1].
    # ĉ = seq_logratio/|y|: with |y| = 10 the sums are 5 and −2.
    # rollout 0: −1·(1 + max(.5, 0)) = −1.5; rollout 1: −1·(1 + max(−.2, 0)) = −1
    shaped, metrics = ace(torch.tensor([-1.0, -1.0]), torch.tensor([5.0, -2.0]), torch.tensor([10, 10]))
    torch.testing.assert_close(shaped, torch.tensor([-1.5, -1.0]))
    # one of the two negatives was scaled; mean multiplier over negatives (1.5 + 1)/2 = 1.25
    assert float(metrics["ace/scaled_frac"]) == pytest.approx(0.5)
    assert float(metrics["ace/neg_multiplier_mean"]) == pytest.approx(1.25)


def test_ace_divides_by_length():
    # the same sum 2 over |y| = 4 gives ĉ = .5 (→ ×1.5), over |y| = 1 gives ĉ = 2 (→ ×3)
    shaped, _ = ace(torch.tensor([-2.0, -2.0]), torch.tensor([2.0, 2.0]), torch.tensor([4, 1]))
    torch.testing.assert_close(shaped, torch.tensor([-3.0, -6.0]))


def test_ace_leaves_positive_and_unconfident_negative_unchanged():
    # A ≥ 0 is untouched whatever ĉ; A < 0 with ĉ ≤ 0 (here −.3 and exactly 0) too
    adv = torch.tensor([0.7, 0.0, 1.2, -0.4, -0.9])
    seq = torch.tensor([9.0, 9.0, -3.0, -3.0, 0.0])
    shaped, _ = ace(adv, seq, torch.full((5,), 10))
    torch.testing.assert_close(shaped, adv)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-50, 50), st.integers(1, 100)), min_size=1, max_size=12))
def test_ace_only_strengthens_negatives(rows):
    adv, seq, lens = (torch.tensor(c, dtype=torch.float32) for c in zip(*rows))
    shaped, _ = ace(adv, seq, lens)
    pos = adv >= 0
    assert torch.equal(shaped[pos], adv[pos])
    assert bool((shaped[~pos] <= adv[~pos] + 1e-6).all())  # never milder than before


def test_ace_no_gradient():
    adv = torch.tensor([-1.0, 1.0], requires_grad=True)
    seq = torch.tensor([3.0, 3.0], requires_grad=True)
    shaped, metrics = ace(adv, seq, torch.tensor([2, 2]))
    assert not shaped.requires_grad
    assert not any(v.requires_grad for v in metrics.values())


# -- novelty_sharpen ----------------------------------------------------------------------


def test_novelty_methods_case():
    # METHODS: NLLs [.2, .6, .4], all correct, one group → multipliers [1, 1.5, 1].
    # mean .4; deviations −.2, .2, 0; Bessel var = (.04 + .04 + 0)/2 = .04, std .2
    # z = [−1, 1, 0] (the +1e-6 in the denominator moves the 6th decimal)
    # multiplier 1 + .5·clip(z, 0, 2) = [1, 1.5, 1]
    shaped, metrics = novelty_sharpen(torch.ones(3), torch.ones(3), torch.tensor([0.2, 0.6, 0.4]),
                                      torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.5, 1.0]), atol=1e-5, rtol=0)
    assert float(metrics["novelty/eligible_frac"]) == pytest.approx(1.0)
    assert float(metrics["novelty/amplified_frac"]) == pytest.approx(1 / 3)


def test_novelty_uses_bessel_std():
    # NLLs [0, 1]: mean .5, Bessel std = sqrt((.25 + .25)/1) = .7071 → z = ±.7071
    # multiplier of the second: 1 + .5·.7071 = 1.3536. (Population std .5 would give z = 1 → 1.5.)
    shaped, _ = novelty_sharpen(torch.ones(2), torch.ones(2), torch.tensor([0.0, 1.0]), torch.zeros(2))
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.3536]), atol=1e-4, rtol=0)


def test_novelty_z_max_clips():
    # NLLs [0, 0, 0, 0, 0, 0, 0, 0, 0, 10]: mean 1; deviations −1 (×9) and 9;
    # Bessel var = (9·1 + 81)/9 = 10, std 3.1623 → z of the last = 9/3.1623 = 2.846 → clipped to 2
    # → multiplier 1 + .5·2 = 2 on an advantage of .8 → 1.6
    nll = torch.tensor([0.0] * 9 + [10.0])
    adv = torch.full((10,), 0.8)
    shaped, _ = novelty_sharpen(adv, torch.ones(10), nll, torch.zeros(10))
    assert float(shaped[-1]) == pytest.approx(1.6, abs=1e-5)
    torch.testing.assert_close(shaped[:9], adv[:9])


def test_novelty_leaves_wrong_rollouts_untouched():
    # rewards [1, 1, 1, 0, 0]: statistics over the three correct ones only ([.2, .6, .4] as above);
    # the wrong ones (NLL 5 and .1, extreme on purpose) keep A even though their z would be large,
    # and their NLLs do not move the correct ones' mean/std.
    adv = torch.tensor([0.8, 0.8, 0.8, -1.2, -1.2])
    nll = torch.tensor([0.2, 0.6, 0.4, 5.0, 0.1])
    shaped, _ = novelty_sharpen(adv, torch.tensor([1.0, 1, 1, 0, 0]), nll, torch.zeros(5))
    # correct: .8·[1, 1.5, 1] = [.8, 1.2, .8]
    torch.testing.assert_close(shaped, torch.tensor([0.8, 1.2, 0.8, -1.2, -1.2]), atol=1e-5, rtol=0)


def test_novelty_needs_two_correct():
    # one correct rollout (with the highest NLL) in the group: nothing to compare against → unchanged
    adv = torch.tensor([1.5, -0.5, -0.5, -0.5])
    shaped, metrics = novelty_sharpen(adv, torch.tensor([1.0, 0, 0, 0]), torch.tensor([3.0, 0.1, 0.2, 0.3]),
                                      torch.zeros(4))
    torch.testing.assert_close(shaped, adv)
    assert float(metrics["novelty/eligible_frac"]) == 0.0


def test_novelty_correctness_is_the_verdict():
    # scores .4 are wrong (rollwise.types.is_correct); a bool tensor of verdicts is taken as is
    adv, nll, gid = torch.ones(3), torch.tensor([0.2, 0.6, 0.4]), torch.zeros(3)
    torch.testing.assert_close(novelty_sharpen(adv, torch.tensor([0.4, 0.4, 0.4]), nll, gid)[0], adv)
    torch.testing.assert_close(novelty_sharpen(adv, torch.tensor([True, True, True]), nll, gid)[0],
                               torch.tensor([1.0, 1.5, 1.0]), atol=1e-5, rtol=0)


def test_novelty_several_groups():
    # interleaved groups:
    #   group 7: indices 0, 2, 4, NLLs [.2, .6, .4], all correct → [1, 1.5, 1] (as in the METHODS case)
    #   group 3: indices 1, 3, NLLs [1, 3], both correct: mean 2, Bessel std sqrt(2) = 1.4142,
    #            z = ±.7071 → [1, 1.3536]. Pooled with group 7 the numbers would differ.
    #   group 5: index 5 alone correct (6 wrong) → unchanged
    gid = torch.tensor([7, 3, 7, 3, 7, 5, 5])
    nll = torch.tensor([0.2, 1.0, 0.6, 3.0, 0.4, 9.0, 0.1])
    rewards = torch.tensor([1.0, 1, 1, 1, 1, 1, 0])
    shaped, _ = novelty_sharpen(torch.ones(7), rewards, nll, gid)
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.0, 1.5, 1.3536, 1.0, 1.0, 1.0]), atol=1e-4, rtol=0)


def test_novelty_strength_and_z_max_arguments():
    # METHODS case with strength 1 and z_max .5: z = [−1, 1, 0] → 1 + clip(z, 0, .5) = [1, 1.5, 1];
    # with strength .2, z_max 2: [1, 1.2, 1]
    args = torch.ones(3), torch.ones(3), torch.tensor([0.2, 0.6, 0.4]), torch.zeros(3)
    torch.testing.assert_close(novelty_sharpen(*args, strength=1.0, z_max=0.5)[0],
                               torch.tensor([1.0, 1.5, 1.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(novelty_sharpen(*args, strength=0.2)[0],
                               torch.tensor([1.0, 1.2, 1.0]), atol=1e-5, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.floats(0, 20)), min_size=1, max_size=16),
    st.floats(0, 2),
    st.floats(0, 4),
)
def test_novelty_multiplier_bounds(rows, strength, z_max):
    gid, correct, nll = zip(*rows)
    gid, rewards, nll = torch.tensor(gid), torch.tensor(correct, dtype=torch.float32), torch.tensor(nll)
    mult, _ = novelty_sharpen(torch.ones(len(rows)), rewards, nll, gid, strength=strength, z_max=z_max)
    assert bool((mult >= 1 - 1e-6).all())
    assert bool((mult <= 1 + strength * z_max + 1e-5).all())
    assert torch.equal(mult[rewards == 0], torch.ones(int((rewards == 0).sum())))  # wrong ones untouched


def test_novelty_no_gradient():
    adv = torch.ones(3, requires_grad=True)
    nll = torch.tensor([0.2, 0.6, 0.4], requires_grad=True)
    shaped, metrics = novelty_sharpen(adv, torch.ones(3), nll, torch.zeros(3))
    assert not shaped.requires_grad
    assert not any(v.requires_grad for v in metrics.values())
    # and a loss built on the shaped advantages sends nothing back to adv or nll
    logp = torch.zeros(3, requires_grad=True)
    (-(shaped * logp).sum()).backward()
    assert adv.grad is None and nll.grad is None
    torch.testing.assert_close(logp.grad, -shaped)


# -- overlong_shaping ---------------------------------------------------------------------


def test_overlong_methods_case():
    # METHODS: L_max 20, L_cache 4 → the soft band starts after 20 − 4 = 16.
    # 16: ≤ 16 → 0; 18: (16 − 18)/4 = −.5; 20: (16 − 20)/4 = −1; 21: beyond L_max → −1
    assert [overlong_penalty(n, 20, 4) for n in (16, 18, 20, 21)] == [0.0, -0.5, -1.0, -1.0]
    # 17: (16 − 17)/4 = −.25; 0 and 5: well inside → 0
    assert overlong_penalty(17, 20, 4) == -0.25
    assert overlong_penalty(0, 20, 4) == overlong_penalty(5, 20, 4) == 0.0


def test_overlong_zero_cache_is_hard_cutoff():
    # L_cache 0: no soft band; 20 is still fine, 21 is −1
    assert overlong_penalty(20, 20, 0) == 0.0
    assert overlong_penalty(21, 20, 0) == -1.0


def test_overlong_rejects_bad_cache():
    with pytest.raises(ValueError):
        overlong_penalty(5, 20, 21)
    with pytest.raises(ValueError):
        overlong_reward(20, -1)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200), st.data())
def test_overlong_monotone_non_increasing(max_len, data):
    cache = data.draw(st.integers(0, max_len))
    a = data.draw(st.integers(0, 2 * max_len + 5))
    b = data.draw(st.integers(a, 2 * max_len + 5))
    pa, pb = overlong_penalty(a, max_len, cache), overlong_penalty(b, max_len, cache)
    assert pb <= pa
    assert -1.0 <= pb <= 0.0


def test_overlong_reward_one_float_per_completion():
    # TRL's convention as score_groups calls it: keyword arguments, completion_ids a list of id lists,
    # extra dataset columns in **kwargs. Lengths 16 / 18 / 20 / 21 → 0 / −.5 / −1 / −1 as above.
    fn = overlong_reward(20, 4)
    ids = [[1] * n for n in (16, 18, 20, 21)]
    out = fn(prompts=["p"] * 4, completions=["c"] * 4, completion_ids=ids, answer=["x"] * 4)
    assert out == [0.0, -0.5, -1.0, -1.0]
    assert all(type(v) is float for v in out)


def test_overlong_reward_default_cache():
    # cache defaults to L_max // 5: L_max 20 → 4, so 18 → −.5 as in the METHODS case;
    # L_max 23 → 23 // 5 = 4, band starts at 19: 21 → (19 − 21)/4 = −.5
    assert overlong_reward(20)(["p"], ["c"], [[0] * 18]) == [-0.5]
    assert overlong_reward(23)(["p"], ["c"], [[0] * 21]) == [-0.5]


def test_overlong_reward_through_score_groups():
    # wired in as a reward function, it sets the component on each rollout
    from rollwise.filter.rewards import RewardFn, score_groups
    from rollwise.types import Prompt, Rollout, RolloutGroup

    def rollout(n):
        return Rollout(prompt_id="q", prompt_ids=[1], completion_ids=[0] * n, behavior_logprobs=[0.0] * n,
                       versions=[0] * n, finish_reason="stop", completion_text="c")

    group = RolloutGroup(prompt=Prompt(id="q", text="q"), rollouts=[rollout(10), rollout(18)])
    score_groups([group], [RewardFn("overlong", overlong_reward(20, 4))])
    assert [r.reward for r in group.rollouts] == [0.0, -0.5]
