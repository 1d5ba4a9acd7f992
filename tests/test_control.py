"""Control, tier 1: each method's math by hand (METHODS.md "Test" lines), budgets conserved under
hypothesis, and the round mechanics (extend, accept + refill, their caps) on stub rounds.

The loop-level checks (every controller x {group, tree} trains, resume, config errors) are in
tests/test_control_loop.py.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollwise.control import ControlConfig, Controller, PromptCursor, PromptStats, build_controller
from rollwise.control.base import ROUND_CAP, equal_split, proportional_split
from rollwise.control.dars import Dars, DarsConfig, cumulative_advantage, dars_extra
from rollwise.control.difficulty import DifficultyConfig, DifficultySelect, estimate_difficulty
from rollwise.control.dynamic_sampling import DynamicSampling, DynamicSamplingConfig, informative
from rollwise.control.gdro import (
    Gdro,
    GdroConfig,
    clipped_surrogate_loss,
    difficulty_bin,
    grpo_advantages,
    loss_at_stake,
    pass_at_k,
    sqrt_allocation,
)
from rollwise.control.rounds import accept_and_refill, extend_rounds, merge_group
from rollwise.control.stats import PromptRecord
from rollwise.control.vade import Vade, VadeConfig
from rollwise.control.xrpo import XrpoAlloc, XrpoConfig, sample_std, t_quantile, xrpo_allocation, xrpo_priority
from rollwise.optim.advantages import group_advantages
from rollwise.types import Prompt, Rollout, RolloutGroup, Tree


def rollout(pid, reward, n_tokens=3):
    return Rollout(prompt_id=pid, prompt_ids=[1], completion_ids=[5] * n_tokens, behavior_logprobs=[-1.0] * n_tokens,
                   versions=[0] * n_tokens, finish_reason="stop", score=reward, reward=reward)


def group(pid, rewards):
    return RolloutGroup(Prompt(pid, pid), [rollout(pid, r) for r in rewards])


class Stream:
    """A train stream of prompts p0, p1, ... (``get`` counts its calls)."""

    def __init__(self, size=None):
        self.size, self.calls = size, 0

    def get(self, i):
        self.calls += 1
        i = i % self.size if self.size else i
        return Prompt(f"p{i}", f"p{i}", token_ids=[1, 2])


# -- dynamic_sampling ----------------------------------------------------------------------------
def test_dynamic_sampling_keeps_only_the_informative_group():
    ds = DynamicSampling(DynamicSamplingConfig())
    groups = [group("a", [1, 1, 1]), group("b", [0, 1, 0]), group("c", [0, 0, 0])]
    assert [g.prompt.id for g in groups if ds.accept(g)] == ["b"]


def test_dynamic_sampling_tolerance_not_inequality():
    assert not informative([0.3, 0.3 + 1e-9])  # differs, but by rounding: zero variance
    assert informative([0.3, 0.3 + 1e-3])
    assert not informative([1.0])  # one rollout has no spread


def test_refill_fills_the_batch_with_fresh_prompts_and_logs_the_cost():
    ds = DynamicSampling(DynamicSamplingConfig(max_rounds=3))
    source, stats = PromptCursor(Stream(), 3), PromptStats()
    outcomes = {"p3": [0, 0], "p4": [1, 0], "p5": [1, 0]}  # refill 1 brings p3 (flat) and p4; refill 2 brings p5
    calls = []

    def run_round(prompts, budgets, salt):
        calls.append(([p.id for p in prompts], budgets, salt))
        return [group(p.id, outcomes[p.id]) for p in prompts], 10 * sum(budgets)

    groups = [group("p0", [1, 1]), group("p1", [0, 1]), group("p2", [0, 0])]  # p1 informative
    kept, m = accept_and_refill(ds, stats, source, groups, run_round, want=3, budget_per_prompt=2)
    assert [g.prompt.id for g in kept] == ["p1", "p4", "p5"]
    assert calls == [(["p3", "p4"], [2, 2], 1), (["p5"], [2], 2)]
    assert m == {"control/refill_rounds": 2.0, "control/refill_tokens": 60.0, "control/dropped_groups": 3.0,
                 "control/kept_groups": 3.0, "control/cap_hit": 0.0}
    assert source.cursor == 6  # the stream moved past the refills


def test_a_controller_that_rejects_everything_stops_at_the_cap():
    """Refilling forever is impossible: accept() always False stops after max_rounds, or ROUND_CAP."""

    class Never(DynamicSampling):
        def accept(self, group):
            return False

    rounds = []

    def run_round(prompts, budgets, salt):
        rounds.append(salt)
        return [group(p.id, [0, 1]) for p in prompts], 1

    for max_rounds, expected in [(3, 3), (0, 0)]:
        rounds.clear()
        c = Never(DynamicSamplingConfig(max_rounds=max_rounds))
        groups = [group("x", [0, 0])]
        kept, m = accept_and_refill(c, PromptStats(), PromptCursor(Stream(), 0), groups, run_round, 2, 2)
        assert len(rounds) == expected and m["control/cap_hit"] == 1.0
        assert kept  # the step still trains on something (the last round's groups)
    c = Never(DynamicSamplingConfig(max_rounds=3))
    c.max_rounds = 10**6  # a controller asking for more than the loop allows
    rounds.clear()
    accept_and_refill(c, PromptStats(), PromptCursor(Stream(), 0), [group("x", [0, 0])], run_round, 2, 2)
    assert len(rounds) == ROUND_CAP

    class Greedy(Controller):
        max_rounds = 10**6

        def extend(self, groups, stats, remaining):
            return [1] * len(groups)

    rounds.clear()
    m = extend_rounds(Greedy(), PromptStats(), [group("x", [0, 1])], run_round, 0)
    assert len(rounds) == ROUND_CAP and m["control/extend_rounds"] == ROUND_CAP


# -- xrpo_alloc ----------------------------------------------------------------------------------
S_HALF = math.sqrt(4 / 3 * 0.25)  # sample std of 2 correct of 4


def test_xrpo_priority_by_hand():
    assert t_quantile(0.975, 3) == pytest.approx(3.1824, abs=1e-4)  # the t table
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert sample_std([1, 1, 0, 0]) == pytest.approx(S_HALF)
    # h(4) - h(5) = s (3.1824 / 2 - 2.7764 / sqrt 5): the t interval's half-width shrinks by .2018
    assert xrpo_priority(4, S_HALF) == pytest.approx(S_HALF * (3.18245 / 2 - 2.77645 / math.sqrt(5)), abs=1e-4)
    assert xrpo_priority(4, S_HALF) == pytest.approx(0.2018, abs=1e-4)
    assert xrpo_priority(4, 0.0) == 0.0 and xrpo_priority(4, 0.0, bonus=0.1) == pytest.approx(0.05)  # bonus / sqrt n


def test_xrpo_gives_the_chunks_to_the_uncertain_prompt():
    assert xrpo_allocation([4, 4], [0.0, S_HALF], budget=4, chunk=4, cap=32) == [0, 4]
    # a chunk later the mixed prompt still beats an all-correct one: h(8) - h(9) = .039 > 0
    assert xrpo_allocation([4, 4], [0.0, S_HALF], budget=8, chunk=4, cap=32) == [0, 8]
    # prompts whose rewards all agree share the budget evenly (fewest rollouts first)
    assert xrpo_allocation([4] * 4, [0.0] * 4, budget=8, chunk=4, cap=32) == [4, 4, 0, 0]


def test_xrpo_concentrates_on_uncertain_prompts_at_the_defaults():
    """The bug of issue 22: at G = 8, n0 = 4, chunks of 4, the old priority p~(1-p~)/(n(n+1)) gave
    every prompt exactly G. Now the step's second half goes to the prompts whose 4 rollouts
    disagree, the budget is spent exactly, and the allocation differs from control.method=none."""
    g, rewards = 8, [[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    c = XrpoAlloc(XrpoConfig(), num_generations=g)
    c.step = 50
    prompts = [Prompt(f"p{i}", "x") for i in range(len(rewards))]
    first = c.allocate(prompts, PromptStats(), len(prompts) * g)
    assert first == [4] * 6 and c.metrics()["control/xrpo_free_share"] == 0.5
    groups = [group(p.id, r) for p, r in zip(prompts, rewards)]
    extra = c.extend(groups, PromptStats(), len(prompts) * g - sum(first))
    totals = [a + b for a, b in zip(first, extra)]
    assert sum(totals) == len(prompts) * g
    assert min(totals[0], totals[3]) > max(totals[1], totals[2], totals[4], totals[5])  # uncertain get more
    assert totals == [16, 4, 4, 16, 4, 4]
    none = build_controller(ControlConfig(), type("R", (), {"num_generations": g, "strategy": "group"})(), seed=0)
    assert totals != none.allocate(prompts, PromptStats(), len(prompts) * g)
    assert c.metrics()["control/rollouts_max"] == 16 and c.metrics()["control/rollouts_min"] == 4


def test_xrpo_warns_when_the_budget_leaves_no_second_phase(caplog):
    c = XrpoAlloc(XrpoConfig(initial=4), num_generations=4)
    prompts = [Prompt(f"p{i}", "x") for i in range(3)]
    with caplog.at_level("WARNING", logger="rollwise.control.xrpo"):
        assert c.allocate(prompts, PromptStats(), 12) == [4, 4, 4]
        c.allocate(prompts, PromptStats(), 12)
    assert c.metrics()["control/xrpo_free_share"] == 0.0
    assert len([r for r in caplog.records if "no second phase" in r.message]) == 1  # once, not every step
    roomy = XrpoAlloc(XrpoConfig(initial=4), num_generations=8)
    roomy.allocate(prompts, PromptStats(), 24)
    assert roomy.metrics()["control/xrpo_free_share"] == 0.5


@given(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 12)), min_size=1, max_size=12),
       st.integers(0, 200), st.integers(1, 6), st.integers(1, 8))
def test_xrpo_allocation_spends_the_budget_exactly(groups, budget, chunk, g):
    counts = [n for n, _ in groups]
    stds = [min(s, n) / 24 for n, s in groups]
    cap = 4 * g + max(counts)
    extra = xrpo_allocation(counts, stds, budget, chunk, cap, bonus=0.01)
    room = sum(cap - n for n in counts)
    assert sum(extra) == min(budget, room) and all(e >= 0 for e in extra)
    assert all(n + e <= cap for n, e in zip(counts, extra))


@given(st.integers(1, 16), st.integers(4, 16), st.data())
def test_xrpo_controller_spends_prompts_times_g(n_prompts, g, data):
    """Both phases together: exactly prompts x G rollouts per step."""
    c = XrpoAlloc(XrpoConfig(), num_generations=g)
    prompts = [Prompt(f"p{i}", "x") for i in range(n_prompts)]
    first = c.allocate(prompts, PromptStats(), n_prompts * g)
    groups = [group(p.id, [data.draw(st.integers(0, 1)) for _ in range(k)]) for p, k in zip(prompts, first)]
    extra = c.extend(groups, PromptStats(), n_prompts * g - sum(first))
    assert sum(first) + sum(extra) == n_prompts * g


# -- gdro ----------------------------------------------------------------------------------------
def test_pass_at_k_and_bins():
    assert pass_at_k(16, 1, 8) == pytest.approx(0.5)  # 1 - C(15,8)/C(16,8)
    assert [difficulty_bin(PromptRecord(attempts=n, successes=s)) for n, s in
            [(8, 0), (16, 1), (16, 2), (8, 8), (0, 0)]] == [0, 1, 2, 3, 4]


def test_rollout_gdro_four_times_the_variance_gets_about_twice_the_rollouts():
    p_hi = 0.5  # p(1-p) = .25
    p_lo = (1 - math.sqrt(1 - 4 * 0.0625)) / 2  # p(1-p) = .0625, a quarter
    n = sqrt_allocation([p_hi, p_lo], budget=300, minimum=2)
    assert sum(n) == 300 and n[0] / n[1] == pytest.approx(2, rel=0.02)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20), st.integers(0, 300), st.integers(0, 4))
def test_sqrt_allocation_conserves_the_budget(rates, budget, minimum):
    n = sqrt_allocation(rates, budget, minimum)
    assert sum(n) == budget and len(n) == len(rates)
    if minimum * len(rates) <= budget:
        assert min(n) >= minimum


@given(st.lists(st.floats(0, 100), min_size=1, max_size=20), st.integers(0, 500), st.integers(0, 5))
def test_proportional_split_conserves_the_budget(weights, budget, minimum):
    n = proportional_split(weights, budget, minimum)
    assert sum(n) == budget and all(x >= 0 for x in n)


def test_gdro_loss_is_the_papers_clipped_surrogate_by_hand():
    """The paper's prompt-level loss (eqs. 5-7): -mean_j min(rho A, clip(rho, .8, 1.2) A)."""
    adv, ratios = [1.0, -1.0, 1.0, -1.0], [1.3, 0.7, 1.1, 0.9]
    # -1.2 (clipped), +0.8 (clipped), -1.1, +0.9  ->  mean -0.15
    assert clipped_surrogate_loss(adv, ratios) == pytest.approx(-0.15)
    assert clipped_surrogate_loss(adv, [1.0] * 4) == 0.0  # at the sampling policy: 0 for every group
    # one correct of four: A = (1.732, -.577 x 3); a clipped step removes eps * mean|A| = .2 * .866
    rewards = [1, 0, 0, 0]
    a = grpo_advantages(rewards)
    assert a == pytest.approx([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)], rel=1e-5)
    best = clipped_surrogate_loss(a, [1.2, 0.8, 0.8, 0.8])
    assert best == pytest.approx(-0.2 * 0.866, abs=1e-3)
    assert loss_at_stake(rewards) == pytest.approx((0.0 - best) / 0.2) == pytest.approx(2 * math.sqrt(0.1875), rel=1e-5)
    assert loss_at_stake([0, 0, 0, 0]) == 0.0 == loss_at_stake([1, 1, 1, 1])  # never / always solved: nothing


def prompt_gdro_after(steps):
    """A Gdro that observed ``steps`` = [(bin record before the step, rewards), ...] per step."""
    c = Gdro(GdroConfig(), num_generations=4)
    stats = PromptStats()
    for step, obs in enumerate(steps):
        groups = []
        for i, (before, rewards) in enumerate(obs):
            stats.records[f"q{i}"] = PromptRecord(attempts=before[0], successes=before[1])
            g = group(f"q{i}", rewards)
            stats.observe(g, step)
            groups.append(g)
        c.observe_step(groups, stats)
    return c


def test_prompt_gdro_update_by_hand():
    """Eqs. 12-15: S_b a bias-corrected EMA (old weight .9) of the bin's mean loss, w_b = exp(2 S_b),
    q = .9 w / sum w + .1 / 5."""
    low, zero = (16, 1), (8, 0)  # pass@8 = .5: bin (0, .5]; pass@8 = 0: bin {0}
    c = prompt_gdro_after([[(low, [1, 0, 1, 0]), (zero, [0, 0, 0, 0])]])
    assert c.corrected_scores().tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.0], abs=1e-5)  # eps of A
    w = np.array([math.exp(-2)] * 5)
    w[1] = 1.0
    assert c.bin_probabilities() == pytest.approx(0.9 * w / w.sum() + 0.02, abs=1e-5)
    assert c.bin_probabilities()[1] == pytest.approx(0.9 / (1 + 4 * math.exp(-2)) + 0.02, abs=1e-5)
    c = prompt_gdro_after([[(low, [1, 0, 1, 0])], [(low, [1, 0, 0, 0])]])  # second loss .866
    assert c.corrected_scores()[1] == pytest.approx((0.9 * 0.1 * 1.0 + 0.1 * 2 * math.sqrt(0.1875)) / (1 - 0.81), abs=1e-5)


def test_prompt_gdro_weight_does_not_grow_with_how_often_a_bin_is_drawn():
    """The bug of issue 22: log w_b += eta * L_b on every step a bin was drawn made a bin's weight grow
    with its draws, and with L = 1 - mean reward it grew fastest for never-solved prompts. The
    paper's weight is a function of the bin's recent mean loss: drawing it 50 times with the same
    loss changes nothing, and a never-solved bin (loss 0) ends below a mixed one."""
    low, zero = (16, 1), (8, 0)
    once = prompt_gdro_after([[(low, [1, 0, 1, 0]), (zero, [0, 0, 0, 0])]])
    often = prompt_gdro_after([[(low, [1, 0, 1, 0]), (zero, [0, 0, 0, 0])]] * 50)
    assert often.bin_probabilities() == pytest.approx(once.bin_probabilities())
    assert often.bin_probabilities()[0] < often.bin_probabilities()[1]


def zero_signal_share(controller, steps=80, n=4, g=8):
    """Share of all-equal groups among what ``controller`` picks from a pool of 40 prompts: 16 never
    solved, 12 always solved, 12 solved half the time (deterministic draws)."""
    truth = [0.0] * 16 + [1.0] * 12 + [0.5] * 12
    rng = np.random.default_rng(1)
    source, stats = PromptCursor(Stream(size=len(truth)), 0), PromptStats()
    flat = total = 0
    for step in range(steps):
        controller.step = step
        chosen = controller.select_prompts(source, stats, n)
        groups = [group(p.id, rng.binomial(1, truth[int(p.id[1:])], size=g).astype(float).tolist()) for p in chosen]
        for gr in groups:
            stats.observe(gr, step)
        controller.observe_step(groups, stats)
        if step >= 20:
            flat += sum(len(set(gr.rewards)) == 1 for gr in groups)
            total += len(groups)
    return flat / total


def test_prompt_gdro_trains_fewer_zero_signal_groups_than_a_uniform_sampler():
    """On a pool that is 70% never or always solved: the baseline (control.method=none, the stream in
    order) and a uniform draw from gdro's own candidates (eta ~ 0) train ~70% zero-signal groups;
    gdro at its defaults far fewer."""
    gdro = zero_signal_share(Gdro(GdroConfig(mode="prompt"), num_generations=8))
    uniform = zero_signal_share(Gdro(GdroConfig(mode="prompt", eta=1e-9), num_generations=8))
    none = zero_signal_share(Controller(num_generations=8))
    assert none == pytest.approx(0.7, abs=0.05) and uniform == pytest.approx(0.7, abs=0.1)
    assert gdro < uniform - 0.2 and gdro < none - 0.2


# -- vade ----------------------------------------------------------------------------------------
def test_vade_picks_mixed_prompts_after_warm_up():
    """p in {0, .5, 1}: after warm-up at least 80% of picks have p = .5."""
    rng = np.random.default_rng(0)
    truth = {f"p{i}": (0.0, 0.5, 1.0)[i % 3] for i in range(30)}
    c = Vade(VadeConfig(fresh_per_step=3), num_generations=8)
    source, stats = PromptCursor(Stream(size=30), 0), PromptStats()
    picks = []
    for step in range(60):
        c.step = step
        chosen = c.select_prompts(source, stats, 4)
        assert len({p.id for p in chosen}) == 4
        for p in chosen:
            stats.observe(group(p.id, rng.binomial(1, truth[p.id], size=8).astype(float).tolist()), step)
        if step >= 20:
            picks += [truth[p.id] for p in chosen]
    assert sum(p == 0.5 for p in picks) / len(picks) >= 0.8


def test_vade_decays_the_posterior():
    stats = PromptStats(visit_decay=0.7)
    stats.observe(group("a", [1, 1, 0]), 0)
    assert (stats.get("a").alpha, stats.get("a").beta) == pytest.approx((0.7 + 2, 0.7 + 1))
    stats.decay_toward_prior(0.99)
    assert stats.get("a").alpha == pytest.approx(1 + 0.99 * 1.7)


# -- dars ----------------------------------------------------------------------------------------
def test_dars_cumulative_advantage_by_hand():
    assert cumulative_advantage(8, 0.5) == pytest.approx(7.48, abs=0.005)
    assert cumulative_advantage(8, 0.125) == pytest.approx(4.95, abs=0.005)
    for k in (4, 1):  # and it is what GRPO's advantages add up to
        adv = group_advantages(torch.tensor([1.0] * k + [0.0] * (8 - k)), torch.zeros(8, dtype=torch.long))
        assert float(adv.abs().sum()) == pytest.approx(cumulative_advantage(8, k / 8), rel=1e-4)


def test_dars_extra_rounds_until_half_correct_or_4g():
    g = 4
    # easy (3/4) none; hard (1/4) a round; hard with 2 correct of 8 (= G/2) done; 16 rollouts: the cap
    assert dars_extra([4, 4, 8, 16, 12], [3, 1, 2, 0, 1], g, 0.5, 16) == [0, 4, 0, 0, 4]
    c = Dars(DarsConfig(), num_generations=g)
    groups = [group("a", [0, 0, 0, 0]), group("b", [1, 1, 1, 0])]
    rounds = []

    def run_round(prompts, budgets, salt):
        rounds.append(budgets)
        return [group(p.id, [0] * b) for p, b in zip(prompts, budgets)], 1

    m = extend_rounds(c, PromptStats(), groups, run_round, 0)
    assert rounds == [[4], [4], [4]] and len(groups[0].rollouts) == 16 and len(groups[1].rollouts) == 4
    assert m["control/extend_rollouts"] == 12.0


# -- difficulty_select ---------------------------------------------------------------------------
def test_difficulty_estimate_by_hand():
    e_r = np.eye(3)
    a_r = np.array([0.1, 0.5, 0.9])
    # e_q = e_r[2]: logits (0, 0, 1/t), so a = (.1 + .5 + .9 e^(1/t)) / (2 + e^(1/t)), rising to .9 as t falls
    for t in (1.0, 0.5, 0.1):
        w = math.exp(1 / t)
        assert estimate_difficulty(e_r[[2]], e_r, a_r, t)[0] == pytest.approx((0.6 + 0.9 * w) / (2 + w))
    assert estimate_difficulty(e_r[[2]], e_r, a_r, 1.0)[0] == pytest.approx(0.6457, abs=1e-4)
    assert estimate_difficulty(e_r[[2]], e_r, a_r, 0.01)[0] == pytest.approx(0.9, abs=1e-6)  # e_q = e_r: a_r as t -> 0
    e_q = np.random.default_rng(0).normal(size=(5, 3))
    e_q /= np.linalg.norm(e_q, axis=1, keepdims=True)
    assert estimate_difficulty(e_q, e_r, np.full(3, 0.3), 0.1) == pytest.approx(np.full(5, 0.3))  # equal a_r: constant


def test_difficulty_select_counts_the_tokens_it_embeds():
    """4B candidates + the references go through a full forward each step: their prompt tokens are
    handed to the loop once (forward_tokens), which adds them to the step's token budget."""
    calls = []

    def embed(prompts):
        calls.append(len(prompts))
        e = np.random.default_rng(len(calls)).normal(size=(len(prompts), 4))
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    c = DifficultySelect(DifficultyConfig(), embed=embed, num_generations=4)
    source, stats = PromptCursor(Stream(), 0), PromptStats()
    chosen = c.select_prompts(source, stats, 2)  # nothing rolled out yet: stream order, no forward
    assert calls == [] and c.forward_tokens() == 0 and c.metrics()["control/embed_tokens"] == 0
    for p in chosen:
        stats.observe(group(p.id, [1, 0]), 0)
    c.observe_step([group(p.id, [1, 0]) for p in chosen], stats)
    c.select_prompts(source, stats, 2)
    assert calls == [8 + 2]  # 4 x 2 candidates and the 2 references, 2 tokens each (Stream)
    assert c.metrics()["control/embed_tokens"] == 20 and c.forward_tokens() == 20
    assert c.forward_tokens() == 0  # read once


class FixedEmbed:
    """A fixed embedder (``fixed``, ``tokens``): one vector per prompt id, 3 tokens a prompt."""

    fixed = True

    def __init__(self):
        self.tokens, self.seen = 0, []

    def __call__(self, prompts):
        self.seen += [p.id for p in prompts]
        self.tokens += 3 * len(prompts)
        e = np.array([[1.0, int(p.id[1:]) % 5, int(p.id[1:]) % 3 + 1.0] for p in prompts])
        return e / np.linalg.norm(e, axis=1, keepdims=True)


def test_a_fixed_embedders_embeddings_are_made_once_kept_and_charged_once():
    """embeddings: start. Each prompt is embedded the first time it is a candidate; a reference (a
    former candidate) and a candidate seen again cost nothing; the kept embeddings survive the
    controller's state (so a resumed run charges none again) and give the same picks."""
    embed = FixedEmbed()
    c = DifficultySelect(DifficultyConfig(), embed=embed, num_generations=4)
    source, stats = PromptCursor(Stream(), 0), PromptStats()
    chosen = c.select_prompts(source, stats, 2)
    for p in chosen:
        stats.observe(group(p.id, [1, 0]), 0)
    c.observe_step([group(p.id, [1, 0]) for p in chosen], stats)
    c.select_prompts(source, stats, 2)  # candidates p8-p15 and the references p0, p1: first seen, embedded
    assert sorted(embed.seen) == sorted(["p0", "p1", *(f"p{i}" for i in range(8, 16))])
    assert c.forward_tokens() == 30 and c.metrics()["control/embed_tokens"] == 30
    c.select_prompts(source, stats, 2)  # a third step: p16-p23 new, p0/p1 (still references) kept
    assert len(embed.seen) == 18 and c.forward_tokens() == 24
    again = DifficultySelect(DifficultyConfig(), embed=embed, num_generations=4)
    again.load_state_dict(c.state_dict())
    assert set(again.kept) == set(c.kept) and all(np.array_equal(again.kept[k], c.kept[k]) for k in c.kept)
    before = len(embed.seen)
    emb, spent = again.embeddings([Prompt(k, k) for k in sorted(c.kept)])
    assert spent == 0 and len(embed.seen) == before and emb.shape == (18, 3)  # all kept: nothing runs


# -- the store, the registry, merging ------------------------------------------------------------
def test_prompt_stats_records_and_round_trips():
    stats = PromptStats()
    stats.register("a", 7)
    stats.observe(RolloutGroup(Prompt("a", "a"), [rollout("a", 1.0, 4), rollout("a", 0.0, 2)]), step=3)
    rec = stats.get("a")
    assert (rec.index, rec.attempts, rec.successes, rec.alpha, rec.beta, rec.last_step) == (7, 2, 1, 2.0, 2.0, 3)
    assert rec.mean_length == 3.0 and rec.group_std == 0.5
    again = PromptStats()
    again.load_state_dict(stats.state_dict())
    assert again.state_dict() == stats.state_dict()


def test_prompt_stats_stay_bounded():
    stats = PromptStats(capacity=8)
    for i in range(30):
        stats.observe(group(f"p{i}", [1, 0]), step=i)
    assert len(stats) <= 10 and "p29" in stats and "p0" not in stats


def test_merge_group_grafts_trees_root_to_root():
    t1, t2 = Tree(), Tree()
    a = t1.add(0, 0)
    t1.add(a, 2), t1.add(a, 2)
    b = t2.add(0, 0)
    t2.nodes[b].end = 3
    g1 = RolloutGroup(Prompt("p", "p"), [rollout("p", 1), rollout("p", 0)], tree=t1)
    g1.rollouts[0].node_path, g1.rollouts[1].node_path = [0, 1, 2], [0, 1, 3]
    g2 = RolloutGroup(Prompt("p", "p"), [rollout("p", 1)], tree=t2)
    g2.rollouts[0].node_path = [0, 1]
    merge_group(g1, g2)
    assert g1.tree.nodes[0].children == [1, 4] and g1.tree.nodes[4].parent == 0 and g1.tree.nodes[4].end == 3
    assert [r.node_path for r in g1.rollouts] == [[0, 1, 2], [0, 1, 3], [0, 4]]
    with pytest.raises(ValueError):
        merge_group(g1, group("q", [1]))


def test_none_is_the_plain_loop():
    c = build_controller(ControlConfig(), type("R", (), {"num_generations": 4, "strategy": "group"})(), seed=0)
    source = PromptCursor(Stream(), 5)
    prompts = c.select_prompts(source, PromptStats(), 3)
    assert [p.id for p in prompts] == ["p5", "p6", "p7"] and source.cursor == 8
    assert c.allocate(prompts, PromptStats(), 12) == [4, 4, 4] and equal_split(10, 4) == [3, 3, 2, 2]
    assert c.accept(group("x", [1, 1])) and c.extend([group("x", [1])], PromptStats(), 0) == [0]


@given(st.sampled_from(["none", "vade", "gdro", "difficulty_select", "arrol", "dars", "dynamic_sampling"]),
       st.integers(1, 12), st.integers(2, 16), st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12))
def test_every_allocate_spends_exactly_the_budget(method, n_prompts, g, history):
    """Whatever the statistics, allocate() hands out prompts x G rollouts (xrpo: with extend, above)."""
    rollout = type("R", (), {"num_generations": g, "strategy": "group", "engine": "auto", "max_new_tokens": 32})()
    c = build_controller(ControlConfig(method=method, gdro=GdroConfig(min_rollouts=2)), rollout, seed=0)
    stats = PromptStats()
    for i, (n, s) in enumerate(history):
        stats.records[f"p{i}"] = PromptRecord(attempts=n, successes=min(s, n), alpha=1 + min(s, n),
                                              beta=1 + n - min(s, n))
    prompts = [Prompt(f"p{i}", "x") for i in range(n_prompts)]
    budgets = c.allocate(prompts, stats, n_prompts * g)
    assert sum(budgets) == n_prompts * g and len(budgets) == n_prompts and min(budgets) >= 1


def test_dars_breadth_trains_two_full_batch_epochs():
    assert Dars(DarsConfig(breadth=True), num_generations=4).update_passes == 2
    assert Dars(DarsConfig(), num_generations=4).update_passes == 1 == Controller().update_passes
