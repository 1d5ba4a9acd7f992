"""Arm against baseline, paired by seed and by prompt: the rule behind every bench verdict.

**Data.** A bench runs the baseline and an arm from one warm start for each seed. A seed fixes
the data order, the held-out eval set and the sampling seeds, so on seed ``s`` both runs are
evaluated greedily on the same ``n_s`` prompts: ``a[s, p]``, ``b[s, p]`` in {0, 1}
(``EvalResult.correct``). The effect is the difference in accuracy,
``Δ = mean_s mean_p (a[s, p] − b[s, p])``.

**The unit is the seed, and prompts are paired within it.** Two runs of one method differ on
every prompt at once (one trained model is simply better than another), so the per-prompt
differences within a seed are correlated. A test that counts the seeds × prompts as independent
calls that training noise a difference (the noise-floor row would show it). So the per-seed
difference ``D_s = mean_p (a[s, p] − b[s, p])`` is the observation: each prompt is compared with
itself (prompt difficulty cancels), and the ``D_s`` are independent (independent runs on
independent eval sets) with mean ``Δ``.

**Test.** The paired t interval ``D̄ ± t(0.975, S−1) · sd(D) / √S`` over the ``S`` seeds and its
two-sided t-test: the cluster-level analysis that is valid with few clusters (Cameron & Miller
2015, "A Practitioner's Guide to Cluster-Robust Inference", §VI: few clusters → T(G−1)
critical values; Donner & Klar 2000, "Design and Analysis of Cluster Randomization Trials",
ch. 6), with the question-level pairing of eval differences of Miller 2024, "Adding Error Bars
to Evals" (arXiv:2411.00640, §2.3 and §4). Each ``D_s`` averages ~200 prompt differences on top
of its run's noise, close to normal, so the interval has its stated 95% coverage —
``tests/test_stats.py`` checks the false-positive rate under a simulated null (seed-level and
prompt-level noise) and the power against a real effect.

**One guard.** The standard error is never taken below the one the prompts alone give
(``prompt_se``: the within-seed variance of the paired differences over ``n_s``, pooled over seeds;
each seed draws its own eval set, as ``arith`` and ``countdown`` do). With few seeds the sample
sd can come out near 0 by chance — three differences of exactly +1 prompt of 200 — and such
differences of a few discrete prompts are where the t test's normality fails; the floor only
widens the interval, so the coverage stays at least the stated one.

**Why not the bootstrap or a sign-flip test.** A percentile bootstrap over ``S`` seeds uses a
critical value of about ``1.96 · √((S−1)/S)`` where ``t(0.975, S−1)`` is needed: at ``S = 3`` its
interval is about ``[min, max]`` of the three differences, so three differences sharing a sign
— 25% of the time under the null — gave a verdict (the old rule); at ``S = 5`` it still covers
~85%. A two-level (seeds, then prompts) bootstrap has the same few-cluster problem at the seed
level. A sign-flip test over ``S`` seeds cannot give a two-sided p below ``2 / 2^S`` (0.0625 at
5 seeds): it could never reject.

**Verdict.** "better" / "worse" when the 95% interval excludes 0 (the same event as p < 0.05);
otherwise "no detectable difference". The verdict is per arm; a table of many arms also carries
each one's Holm-adjusted p over the table (``holm``), the family-wise reading. One paired seed
gives no interval and no verdict. Runs that are equal on every prompt of every seed (``D_s = 0``) give Δ = 0 [0, 0].

Also here: the ledger's trajectory comparisons — the first step at which two runs' per-step
records part (``departure_step``) and arms whose runs are identical on every seed
(``identical_groups``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

LEVEL = 0.95
NO_DIFFERENCE = "no detectable difference"


# -- Student's t, without scipy --------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b).

    >>> round(betainc(2.0, 3.0, 0.4), 6)  # 1 - (1-x)^4 - 4x(1-x)^3
    0.5248
    """
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom.

    >>> round(t_two_sided_p(2.776445, 4), 4)
    0.05
    """
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile (q > 0.5) of Student's t, by bisection on the tail probability.

    >>> round(t_quantile(0.975, 4), 4), round(t_quantile(0.975, 2), 4)
    (2.7764, 4.3027)
    """
    lo, hi, tail = 0.0, 1.0, 2.0 * (1.0 - q)
    while t_two_sided_p(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > tail else (lo, mid)
    return (lo + hi) / 2.0


# -- the paired effect -----------------------------------------------------------------------
def correctness(vector) -> np.ndarray:
    """A per-prompt correctness record as a 0/1 array: a string of '0'/'1' (as the benches store it)
    or a sequence of bools/ints.

    >>> correctness("0110").tolist()
    [0, 1, 1, 0]
    """
    if isinstance(vector, str):
        return np.frombuffer(vector.encode(), dtype=np.uint8).astype(np.int64) - ord("0")
    return np.asarray(vector, dtype=np.int64)


def correct_string(vector) -> str:
    """The compact form benches store: one '0'/'1' per prompt, in eval-set order.

    >>> correct_string([True, False, 1])
    '101'
    """
    return "".join("1" if c else "0" for c in vector)


@dataclass
class PairedEffect:
    """Arm minus baseline over the paired seeds: Δ in accuracy (fraction), its 95% interval, the
    t-test's p, the per-seed differences, how many seeds and seed × prompt pairs, and the verdict."""

    difference: float
    ci95: tuple[float, float] | None  # None: fewer than two paired seeds
    p: float | None
    seed_differences: list[float]
    seeds: int
    pairs: int  # seeds x prompts compared
    prompt_se: float  # the standard error per-prompt noise alone would give (the rest is training noise)
    verdict: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ci95"] = None if self.ci95 is None else list(self.ci95)
        return d


def seed_test(diffs: Sequence[float], level: float = LEVEL, min_se: float = 0.0,
              ) -> tuple[float, tuple[float, float] | None, float | None]:
    """(mean, t interval at ``level``, two-sided p) of per-seed differences ``diffs``, the standard
    error taken at least ``min_se``.

    >>> seed_test([0.25, 0.25, 0.25])
    (0.25, (0.25, 0.25), 0.0)
    >>> seed_test([0.2])
    (0.2, None, None)
    >>> round(seed_test([0.25, 0.25, 0.25], min_se=0.1)[2], 3)  # t = 2.5 on 2 degrees of freedom
    0.13
    """
    d = np.asarray(diffs, dtype=np.float64)
    mean = float(d.mean())
    if len(d) < 2:
        return mean, None, None
    se = max(float(d.std(ddof=1)) / math.sqrt(len(d)), min_se)
    if se < 1e-15:  # every seed the same difference: exactly that, no doubt left
        return mean, (mean, mean), (1.0 if abs(mean) < 1e-15 else 0.0)
    half = t_quantile(0.5 + level / 2, len(d) - 1) * se
    return mean, (mean - half, mean + half), t_two_sided_p(mean / se, len(d) - 1)


def verdict(ci: tuple[float, float] | None, p: float | None, alpha: float = 1 - LEVEL) -> str:
    """"better"/"worse" when the interval excludes 0 and p < alpha, else "no detectable difference".

    >>> verdict((0.01, 0.2), 0.01), verdict((-0.2, -0.01), 0.02), verdict((-0.1, 0.1), 0.6), verdict(None, None)
    ('better', 'worse', 'no detectable difference', 'no detectable difference')
    """
    if ci is None or p is None or p >= alpha:
        return NO_DIFFERENCE
    if ci[0] > 0:
        return "better"
    if ci[1] < 0:
        return "worse"
    return NO_DIFFERENCE


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A Simple Sequentially Rejective Multiple Test
    Procedure"): the family-wise error over a table's arms. Rejecting where the adjusted p < alpha
    keeps the chance of any false verdict among them at most alpha; ten arms read one by one at
    0.05 give a chance verdict in up to 40% of ledgers.

    >>> holm([0.01, 0.04, 0.03, 0.5])
    [0.04, 0.09, 0.09, 0.5]
    """
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = round(running, 12)
    return adjusted


def add_holm(rows: Mapping[str, dict], family: Sequence[str]) -> None:
    """Set ``p_holm`` on the rows of ``family`` (a table's method arms) that have a ``p``: Holm over them."""
    arms = [arm for arm in family if rows[arm].get("p") is not None]
    for arm, adjusted in zip(arms, holm([rows[arm]["p"] for arm in arms])):
        rows[arm]["p_holm"] = adjusted


def paired_effect(arm: Mapping[Hashable, object], baseline: Mapping[Hashable, object]) -> PairedEffect:
    """The arm's effect against the baseline, from per-prompt correctness on each seed
    (``{seed: correctness}``, strings or 0/1 sequences); seeds missing from either side are left out.

    >>> e = paired_effect({0: "1100", 1: "1110"}, {0: "1000", 1: "0110"})  # +1 prompt of 4 on each seed
    >>> e.difference, e.seed_differences, e.pairs, round(e.prompt_se, 4), e.verdict
    (0.25, [0.25, 0.25], 8, 0.1768, 'no detectable difference')
    """
    seeds = [s for s in arm if s in baseline]
    diffs, within = [], []
    for s in seeds:
        a, b = correctness(arm[s]), correctness(baseline[s])
        if a.shape != b.shape:
            raise ValueError(f"seed {s}: {len(a)} arm prompts against {len(b)} baseline prompts; a pair needs one "
                             "eval set")
        d = (a - b).astype(np.float64)
        diffs.append(float(d.mean()))
        within.append(float(d.var(ddof=1)) / len(d) if len(d) > 1 else 0.0)
    if not seeds:
        return PairedEffect(float("nan"), None, None, [], 0, 0, float("nan"), NO_DIFFERENCE)
    prompt_se = math.sqrt(sum(within)) / len(seeds)  # se of the mean of D_s if only prompts varied
    mean, ci, p = seed_test(diffs, min_se=prompt_se)
    pairs = sum(len(correctness(arm[s])) for s in seeds)
    return PairedEffect(mean, ci, p, diffs, len(seeds), pairs, prompt_se, verdict(ci, p))


# -- trajectories ----------------------------------------------------------------------------
def departure_step(run: Sequence, baseline: Sequence) -> int | None:
    """The first step (1-based) whose record differs between two runs' per-step traces — a step
    only one of them ran counts as differing — or None when the traces are equal (the arm had no
    occasion to differ).

    >>> departure_step([[10, .5], [12, .5], [9, .25]], [[10, .5], [11, .5], [9, .25]])
    2
    >>> departure_step([[10, .5]], [[10, .5], [11, .5]]), departure_step([[10, .5]], [[10, .5]])
    (2, None)
    """
    for i, (a, b) in enumerate(zip(run, baseline), start=1):
        if list(a) != list(b):
            return i
    return None if len(run) == len(baseline) else min(len(run), len(baseline)) + 1


def identical_groups(fingerprints: Mapping[str, Mapping[Hashable, object]]) -> list[list[str]]:
    """Arms whose runs are identical on every seed (same seeds, equal fingerprints), as groups in
    the order of ``fingerprints``; an arm alike no other is a group of one.

    >>> identical_groups({"a": {0: "x", 1: "y"}, "b": {0: "x", 1: "z"}, "c": {0: "x", 1: "y"}})
    [['a', 'c'], ['b']]
    """
    groups: list[list[str]] = []
    keys: list[Mapping] = []
    for arm, prints in fingerprints.items():
        for group, key in zip(groups, keys):
            if dict(prints) == dict(key):
                group.append(arm)
                break
        else:
            groups.append([arm])
            keys.append(prints)
    return groups
