"""The bench verdict rule (rollwise.bench.stats): Student's t by table, the paired effect by hand,
and its behaviour on simulated benches — false positives at the stated rate under the null, power
against a real effect, and the old 3-seed rule's failure (three differences sharing a sign) gone.

The simulated bench: on each seed the eval set is new (prompt difficulty θ ~ N(logit base, 1.5));
each run adds its own shift u ~ N(0, seed_sd) on every prompt at once (one trained model is
better than another) and a per-prompt run noise e ~ N(0, 0.7); a prompt is correct when a
uniform draw falls below sigmoid(θ + u + e (+ effect for the arm)). Every random draw comes from
a numpy generator seeded by the test (hypothesis draws the seed, derandomized), so each test
gives the same verdict on every run.
"""

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.bench import stats
from rollwise.bench.stats import (
    NO_DIFFERENCE,
    departure_step,
    holm,
    identical_groups,
    paired_effect,
    seed_test,
    t_quantile,
    t_two_sided_p,
    verdict,
)


def simulate(rng, reps, seeds, prompts, base=0.5, seed_sd=0.3, effect=0.0):
    """(arm, baseline) correctness, each [reps, seeds, prompts] of 0/1."""
    theta = rng.normal(math.log(base / (1 - base)), 1.5, (reps, seeds, prompts))
    u_arm, u_base = rng.normal(0, seed_sd, (2, reps, seeds, 1))
    e_arm, e_base = rng.normal(0, 0.7, (2, *theta.shape))

    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    arm = rng.random(theta.shape) < sigmoid(theta + u_arm + e_arm + effect)
    base_ = rng.random(theta.shape) < sigmoid(theta + u_base + e_base)
    return arm.astype(int), base_.astype(int)


def effects(arm, base):
    return [paired_effect(dict(enumerate(a)), dict(enumerate(b))) for a, b in zip(arm, base)]


def rate(found, what=("better", "worse")):
    return sum(e.verdict in what for e in found) / len(found)


def old_rule(diffs, resamples=2000, seed=0):
    """The ledger's old verdict: a 95% percentile bootstrap over seeds excludes 0."""
    d = np.asarray(diffs)
    means = d[np.random.default_rng(seed).integers(0, len(d), (resamples, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return lo > 0 or hi < 0


# -- by hand -----------------------------------------------------------------------------------
def test_t_distribution_matches_the_tables():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.975, 29) == pytest.approx(2.0452, abs=1e-4)
    assert t_quantile(0.975, 100_000) == pytest.approx(1.95997, abs=1e-4)
    assert t_two_sided_p(2.0, 10) == pytest.approx(0.07339, abs=1e-5)
    assert t_two_sided_p(0.0, 3) == pytest.approx(1.0) and t_two_sided_p(math.inf, 3) == 0.0


def ones(k, n=100):
    return "1" * k + "0" * (n - k)


def test_paired_effect_by_hand():
    # per-seed differences +0.5, -0.25, +0.25 on 100 prompts: mean 1/6, sd 0.3819, se 0.2205, t(2) = 4.3027
    e = paired_effect({0: ones(50), 1: ones(0), 2: ones(75)}, {0: ones(0), 1: ones(25), 2: ones(50)})
    half = 4.302653 * np.std([0.5, -0.25, 0.25], ddof=1) / math.sqrt(3)
    assert e.seed_differences == [0.5, -0.25, 0.25] and e.difference == pytest.approx(1 / 6)
    assert e.ci95 == pytest.approx((1 / 6 - half, 1 / 6 + half), abs=1e-5)
    t = (1 / 6) / (half / 4.302653)
    assert e.p == pytest.approx(1 - t / math.sqrt(2 + t * t))  # the t(2) tail in closed form
    assert e.verdict == NO_DIFFERENCE and (e.seeds, e.pairs) == (3, 300)
    # the prompts' own noise: 50, 25, 25 prompts of 100 differ -> within-seed variances 0.2525, 0.1894, 0.1894
    assert e.prompt_se == pytest.approx(math.sqrt((0.252525 + 0.189394 * 2) / 100) / 3, abs=1e-5)
    # a seed only one side ran is left out; one paired seed has no interval
    e = paired_effect({0: "11", 1: "11"}, {0: "01"})
    assert (e.seeds, e.ci95, e.p, e.verdict) == (1, None, None, NO_DIFFERENCE)
    assert paired_effect({0: "11"}, {0: "11"}).difference == 0.0
    with pytest.raises(ValueError, match="one eval set"):
        paired_effect({0: "110"}, {0: "11"})


def test_the_standard_error_is_never_below_the_prompts():
    """Three seeds, each +1 prompt of 4 (the seeds' sd is 0): the old rule's +25 [+25, +25] "better".
    The prompts alone give se = sqrt(3 x 0.0625) / 3 = 0.1443: t = 1.73 on 2 df, no verdict."""
    e = paired_effect({s: "1100" for s in range(3)}, {s: "1000" for s in range(3)})
    assert e.seed_differences == [0.25] * 3 and e.prompt_se == pytest.approx(0.144338, abs=1e-6)
    assert e.ci95 == pytest.approx((0.25 - 4.302653 * 0.144338, 0.25 + 4.302653 * 0.144338), abs=1e-5)
    t = 0.25 / math.sqrt(3 * 0.0625) * 3
    assert e.p == pytest.approx(1 - t / math.sqrt(2 + t * t)) and e.verdict == NO_DIFFERENCE
    # the same +25 points on 100 prompts per seed: now the prompts leave little doubt
    e = paired_effect({s: ones(75) for s in range(3)}, {s: ones(50) for s in range(3)})
    assert e.verdict == "better" and e.p < 0.01


def test_identical_runs_and_verdict_edges():
    assert seed_test([0.0, 0.0, 0.0]) == (0.0, (0.0, 0.0), 1.0)
    assert paired_effect({0: "10", 1: "01"}, {0: "10", 1: "01"}).verdict == NO_DIFFERENCE
    assert verdict((0.01, 0.2), 0.2) == NO_DIFFERENCE  # a test's p decides too
    assert verdict((-0.3, -0.1), 0.001) == "worse"


def test_trajectories():
    assert departure_step([[1, 0.5], [2, 0.5]], [[1, 0.5], [2, 0.5]]) is None
    assert departure_step([[1, 0.5], [2, 0.25]], [[1, 0.5], [2, 0.5]]) == 2
    assert departure_step([[3, 0.5]], [[1, 0.5]]) == 1
    assert departure_step([[1, 0.5]], [[1, 0.5], [2, 0.5]]) == 2  # one run stopped earlier: they differ there
    assert identical_groups({"a": {0: "x"}, "b": {0: "x", 1: "y"}, "c": {0: "x"}}) == [["a", "c"], ["b"]]
    assert identical_groups({}) == []


def test_doctests():
    assert doctest.testmod(stats).failed == 0


# -- on simulated benches ----------------------------------------------------------------------
def test_null_false_positive_rate_is_the_stated_five_percent():
    """1,000 null comparisons (5 seeds x 200 prompts, training noise on each seed): about 5% verdicts
    (binomial sd 0.7 points) — the interval covers 0 as often as it says; the old rule's 3-seed
    bootstrap on the same data gives a verdict far more often."""
    arm, base = simulate(np.random.default_rng(1), 1000, 5, 200)
    assert 0.03 <= rate(effects(arm, base)) <= 0.07
    arm3, base3 = arm[:, :3], base[:, :3]
    old = [old_rule((a.mean(axis=1) - b.mean(axis=1)).tolist()) for a, b in zip(arm3[:300], base3[:300])]
    assert sum(old) / len(old) > 0.15


def test_a_test_counting_prompts_as_independent_fails_the_noise_floor():
    """Why seeds are the unit: pooling the 5 x 200 paired prompts as one sample (a z interval on them)
    ignores the run-level shift and calls noise a difference in most null comparisons."""
    arm, base = simulate(np.random.default_rng(2), 200, 5, 200, seed_sd=0.3)
    d = (arm - base).reshape(200, -1).astype(float)
    z = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(d.shape[1]))
    assert np.mean(np.abs(z) > 1.96) > 0.2 and rate(effects(arm, base)) <= 0.1


def test_holm_keeps_a_ten_arm_table_to_its_stated_family_wise_rate():
    """300 null tables of 10 arms (5 seeds x 200 prompts each): read one by one at 0.05, about
    1 - 0.95^10 = 40% of tables show a chance verdict; by Holm-adjusted p, about 5%."""
    tables = [effects(*simulate(np.random.default_rng(10 + arm), 300, 5, 200)) for arm in range(10)]
    p = np.array([[e.p for e in arm] for arm in tables]).T  # [table, arm]
    per_arm = np.mean((p < 0.05).any(axis=1))
    family = np.mean([min(holm(list(row))) < 0.05 for row in p])
    assert per_arm > 0.25 and family <= 0.09


@settings(max_examples=8)
@given(seeds=st.integers(3, 8), prompts=st.integers(50, 200), base=st.floats(0.2, 0.8),
       seed_sd=st.floats(0.0, 0.6), rng_seed=st.integers(0, 2**32 - 1))
def test_under_the_null_few_false_positives(seeds, prompts, base, seed_sd, rng_seed):
    """Arm and baseline drawn from one distribution: at most 10% of 200 comparisons get a verdict."""
    arm, base_ = simulate(np.random.default_rng(rng_seed), 200, seeds, prompts, base, seed_sd)
    assert rate(effects(arm, base_)) <= 0.10


@settings(max_examples=8)
@given(seeds=st.integers(5, 8), effect=st.floats(0.8, 1.2), sign=st.sampled_from([1, -1]),
       seed_sd=st.floats(0.0, 0.15), rng_seed=st.integers(0, 2**32 - 1))
def test_a_real_effect_is_detected(seeds, effect, sign, seed_sd, rng_seed):
    """A logit shift of 0.8-1.2 (about 13-19 accuracy points at 50%) on 5+ seeds x 200 prompts is
    found with the right sign in at least 90% of 100 comparisons, never with the wrong one."""
    arm, base = simulate(np.random.default_rng(rng_seed), 100, seeds, 200, 0.5, seed_sd, sign * effect)
    found = effects(arm, base)
    right, wrong = ("better", "worse") if sign > 0 else ("worse", "better")
    assert rate(found, (right,)) >= 0.9 and rate(found, (wrong,)) == 0


def test_the_interval_covers_a_real_effect():
    """With an effect, the 95% interval holds the true accuracy difference (Monte Carlo) ~95% of the time."""
    rng = np.random.default_rng(3)
    arm, base = simulate(rng, 600, 5, 200, 0.5, 0.2, 0.3)
    big_arm, big_base = simulate(rng, 1, 4000, 200, 0.5, 0.2, 0.3)
    truth = big_arm.mean() - big_base.mean()
    covered = [e.ci95[0] <= truth <= e.ci95[1] for e in effects(arm, base)]
    assert 0.92 <= np.mean(covered) <= 0.98


@settings(max_examples=6)
@given(prompts=st.integers(100, 200), seed_sd=st.floats(0.1, 0.5), rng_seed=st.integers(0, 2**32 - 1))
def test_three_seeds_sharing_a_sign_no_longer_decide(prompts, seed_sd, rng_seed):
    """The old failure: with 3 seeds, a bootstrap interval excludes 0 whenever the three paired
    differences share a sign (25% of null comparisons). Among null comparisons whose three
    differences share a sign, the old rule gives a verdict to all; the new rule to few (expected
    0.05 / 0.25 = 20%)."""
    arm, base = simulate(np.random.default_rng(rng_seed), 400, 3, prompts, 0.5, seed_sd)
    found = effects(arm, base)
    same_sign = [e for e in found if all(d > 0 for d in e.seed_differences) or all(d < 0 for d in e.seed_differences)]
    assert len(same_sign) >= 60  # ~100 expected
    assert all(old_rule(e.seed_differences) for e in same_sign)
    assert rate(same_sign) <= 0.35 and rate(found) <= 0.1
