"""Unbiased pass@k from n samples of which c are correct.

Chen et al., 2021, "Evaluating Large Language Models Trained on Code" (the Codex paper),
section 2.1: pass@k = E[1 − C(n−c, k) / C(n, k)] over problems. The binomial ratio is
computed as the product Π_{i=n−c+1}^{n} (1 − k/i), as in the paper's reference code, so it
never forms the huge binomials (n = 256, k = 128 overflows a float otherwise).
"""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct.

    >>> round(pass_at_k(4, 2, 2), 4)
    0.8333
    """
    for name, value in (("n", n), ("c", c), ("k", k)):
        if value < 0:
            raise ValueError(f"pass_at_k needs non-negative counts, got {name}={value}")
    if k == 0:
        raise ValueError("pass_at_k needs k >= 1")
    if k > n:
        raise ValueError(f"pass_at_k needs k <= n (cannot draw k={k} of n={n} samples)")
    if c > n:
        raise ValueError(f"pass_at_k needs c <= n (c={c} correct of n={n} samples)")
    if n - c < k:  # every draw of k contains a correct sample
        return 1.0
    # C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i)
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given as ``(n, c)`` pairs (samples drawn, samples correct)."""
    if not counts:
        raise ValueError("mean_pass_at_k got no problems")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
