"""``weaver`` (issue 36 §1): weak verifiers combined by an EM fit, without labels.

METHODS.md's test idea: EM recovers simulated TPR/FPR to within .03 on 10k items, and a
coin-flip verifier is dropped; P(correct | votes) by hand; the reward differs from the single
verifier's (GRPO's input) on a small case.
"""

import numpy as np
import pytest

from rollwise.filter.weaver import Weaver, WeaverConfig, binarize, fit_and_drop, fit_em, posterior

TRUE = [(0.9, 0.2), (0.8, 0.1), (0.7, 0.3), (0.85, 0.25)]  # (TPR, FPR) of four weak verifiers
COIN = (0.5, 0.5)


def simulate(rates, n=10_000, prior=0.3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < prior
    votes = np.stack([np.where(y, rng.random(n) < tpr, rng.random(n) < fpr) for tpr, fpr in rates], axis=1)
    return y, votes.astype(float)


def test_em_recovers_simulated_rates_within_003_and_drops_a_coin_flip():
    _, votes = simulate(TRUE + [COIN])
    kept, prior, tpr, fpr = fit_and_drop(votes, np.ones_like(votes), min_gap=0.05)
    assert kept.tolist() == [0, 1, 2, 3]  # the coin flip (index 4) is dropped
    assert prior == pytest.approx(0.3, abs=0.03)
    assert np.abs(tpr - [r[0] for r in TRUE]).max() < 0.03
    assert np.abs(fpr - [r[1] for r in TRUE]).max() < 0.03


def test_posterior_by_hand_and_missing_votes():
    tpr, fpr = np.array([0.9, 0.8]), np.array([0.2, 0.1])
    votes = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    mask = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])  # the last: the second verifier cast no vote
    p = posterior(votes, mask, 0.5, tpr, fpr)
    assert p[0] == pytest.approx(0.72 / 0.74)  # .9·.8 vs .2·.1
    assert p[1] == pytest.approx(0.18 / (0.18 + 0.18))  # .9·.2 vs .2·.9
    assert p[2] == pytest.approx(0.9 / 1.1)  # .9 vs .2
    assert binarize(np.array([3.0, 1.0, 2.0, np.nan])).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_em_on_missing_votes_still_recovers():
    _, votes = simulate(TRUE, seed=1)
    mask = (np.random.default_rng(2).random(votes.shape) > 0.2).astype(float)  # a fifth of the votes missing
    prior, tpr, fpr = fit_em(votes, mask)
    assert np.abs(tpr - [r[0] for r in TRUE]).max() < 0.03 and np.abs(fpr - [r[1] for r in TRUE]).max() < 0.03


def _fixed(values):
    return lambda completions, **_: [values[c] for c in completions]


def test_weaver_reward_is_the_posterior_and_differs_from_one_verifier():
    # three verifiers of known behaviour over 4 completion kinds, repeated: the fit has data to work with
    kinds = ["a", "b", "c", "d"] * 50
    v1 = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 0.0}
    v2 = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}
    v3 = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    w = Weaver(WeaverConfig(verifiers=[{"name": "v1"}, {"name": "v2"}, {"name": "v3"}]),
               [("v1", _fixed(v1)), ("v2", _fixed(v2)), ("v3", _fixed(v3))])
    scores = w(["q"] * len(kinds), kinds)
    m = w.step_metrics()
    prior, tpr, fpr = m["weaver/prior"], [m[f"weaver/tpr/v{i}"] for i in (1, 2, 3)], [m[f"weaver/fpr/v{i}"] for i in (1, 2, 3)]
    by_kind = {k: float(s) for k, s in zip(kinds, scores)}
    for k, votes in {"a": (1, 1, 1), "b": (1, 0, 1), "c": (0, 0, 1), "d": (0, 0, 0)}.items():
        expected = posterior(np.array([votes], dtype=float), np.ones((1, 3)), prior, np.array(tpr), np.array(fpr))
        assert by_kind[k] == pytest.approx(float(expected[0]))
    assert by_kind["a"] > by_kind["b"] > by_kind["c"] > by_kind["d"]
    assert sorted(set(by_kind.values())) != [0.0, 1.0]  # not v1's 0/1: b and c fall between
    assert scores[0].reason == f"P(correct | votes 111) = {by_kind['a']:.3f}"


def test_weaver_is_one_config_line_and_an_arm():
    from rollwise.bench.ablate import arm_lines, default_arms
    from rollwise.config import ConfigError
    from rollwise.filter.registry import resolve_rewards
    from rollwise.train.config import load_run_config

    cfg = load_run_config(None, ["rewards=[{name: weaver}]"])
    fns, judge = resolve_rewards(cfg.rewards, cfg.task.build(0), warn=False)
    assert isinstance(fns[0].fn, Weaver) and fns[0].fn.names == ["arith", "arith_working", "math_answer"]
    assert judge.name == "arith"
    with pytest.raises(ConfigError, match="at least 3 items|3 or more"):
        load_run_config(None, ["rewards=[{name: weaver, weaver: {verifiers: [{name: arith}, {name: arith}]}}]"])
    assert "reward:weaver" in default_arms() and arm_lines("reward:weaver") == ["rewards=[{name: weaver}]"]
    with pytest.raises(ConfigError, match="a judge needs its section"):
        load_run_config(None, ["rewards=[{name: weaver, weaver: {verifiers: [{name: arith}, {name: judge}, "
                               "{name: math_answer}]}}]"])
