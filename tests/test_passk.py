"""pass@k (Chen et al., 2021): hand cases, edge cases, and k = 1 as the plain accuracy."""

from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollwise.eval.passk import mean_pass_at_k, pass_at_k


def test_hand_case_n4_c2_k2():
    # C(2, 2)/C(4, 2) = 1/6 → pass@2 = 5/6 = .8333 (METHODS.md support_diag)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert round(pass_at_k(4, 2, 2), 4) == 0.8333


def test_no_correct_is_zero_and_all_correct_is_one():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n − c = 2 < k: every draw of 3 holds a correct one


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_k1_is_accuracy(nc):
    n, c = nc
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_matches_binomial_form(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_large_n_is_stable():
    # the direct binomials here exceed 1e75; the product form stays in [0, 1]
    value = pass_at_k(256, 1, 128)
    assert value == pytest.approx(0.5)  # one correct sample of 256, half of them drawn


@pytest.mark.parametrize(
    "n,c,k,match",
    [(4, 2, 5, "k <= n"), (4, 5, 2, "c <= n"), (-1, 0, 1, "n=-1"), (4, -1, 1, "c=-1"), (4, 1, -2, "k=-2"),
     (4, 1, 0, "k >= 1")],
)
def test_errors(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    # (4, 2) → 5/6; (4, 0) → 0; (4, 4) → 1 → mean = (5/6 + 0 + 1)/3 = 11/18
    assert mean_pass_at_k([(4, 2), (4, 0), (4, 4)], 2) == pytest.approx(11 / 18)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], 1)
