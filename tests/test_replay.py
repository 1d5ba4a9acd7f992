"""Replay methods (METHODS.md, replay/): the buffer's age limit and FIFO, rollout_replay's share,
ReMix's UTD / reincarnation / KL-convex term, RoRecomp's split, and exact resumes — on groups
built by hand, no model."""

import ast
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rollwise
from rollwise.config import ConfigError
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import ObjectiveConfig, policy_loss
from rollwise.replay import REPLAY_METHODS, Replay, ReplayConfig, build_replay, check_composition, remix_objective
from rollwise.replay.buffer import ReplayBuffer, birth_version
from rollwise.replay.rorecomp import priority_mask, split_group
from rollwise.types import Prompt, Rollout, RolloutGroup, Tree


def rollout(length: int, score: float, version: int = 0, advantage: float = 1.0, text: str = "") -> Rollout:
    return Rollout("p", [1, 2], [7] * length, [-0.5] * length, [version] * length, "stop", completion_text=text,
                   score=score, reward=score, advantage=[advantage] * length)


def group(pid: str, version: int, lengths=(3, 5), scores=(1.0, 0.0), advantages=(1.0, -1.0)) -> RolloutGroup:
    return RolloutGroup(Prompt(pid, pid), [rollout(n, s, version, a) for n, s, a in zip(lengths, scores, advantages)])


def build(method: str, total_steps: int = 10, **options) -> Replay:
    cfg = ReplayConfig(method=method, **({method: options} if options else {}))
    return build_replay(cfg, seed=3, prompts_per_step=4, total_steps=total_steps)


def run_step(replay: Replay, step: int, n: int = 4, version: int | None = None):
    """One synchronous step: ask how many fresh prompts, make them at ``version`` (= step), compose."""
    version = step if version is None else version
    fresh = [group(f"s{step}g{i}", version) for i in range(replay.fresh_prompts(n, step))]
    groups, metrics = replay.compose(fresh, step=step, version=version)
    return fresh, groups, metrics


def served_of(fresh, groups):
    ids = {id(g) for g in fresh}
    return [g for g in groups if id(g) not in ids]


# -- the buffer ------------------------------------------------------------------------------
def test_birth_version_is_the_oldest_token():
    g = RolloutGroup(Prompt("p", "p"), [Rollout("p", [1], [5, 6], [-.1, -.2], [4, 5], "stop"),
                                        Rollout("p", [1], [5], [-.1], [3], "stop")])
    assert birth_version(g, default=9) == 3
    assert birth_version(RolloutGroup(Prompt("p", "p"), []), default=9) == 9


def test_buffer_evicts_fifo_at_capacity():
    buf = ReplayBuffer(capacity=3, max_age=10)
    groups = [group(f"g{i}", 0) for i in range(5)]
    buf.add(groups[:2], 0)
    buf.add(groups[2:], 0)
    assert len(buf) == 3 and buf.evicted == 2
    assert buf.sample(10, np.random.default_rng(0), 0) == groups[2:]  # the first two added went first


def test_buffer_serves_nothing_older_than_max_age_hand_case():
    buf = ReplayBuffer(capacity=10, max_age=2)
    buf.add([group("v0", 0)], 0)
    buf.add([group("v1", 1)], 1)
    buf.add([group("v2", 2)], 2)
    assert buf.servable(3) == 2  # ages 3, 2, 1
    served = buf.sample(5, np.random.default_rng(0), 3)
    assert [g.prompt.id for g in served] == ["v1", "v2"]
    assert len(buf) == 2 and buf.expired == 1  # the aged-out group can never be served again


@settings(max_examples=60, derandomize=True, deadline=None)
@given(births=st.lists(st.integers(0, 12), min_size=0, max_size=20), version=st.integers(0, 14),
       max_age=st.integers(0, 4), n=st.integers(0, 8), seed=st.integers(0, 5))
def test_buffer_sample_property(births, version, max_age, n, seed):
    buf = ReplayBuffer(capacity=64, max_age=max_age)
    for i, b in enumerate(births):
        buf.add([group(f"g{i}", b)], b)
    eligible = sum(1 for b in births if version - b <= max_age)
    served = buf.sample(n, np.random.default_rng(seed), version)
    assert len(served) == min(n, eligible)
    assert len({id(g) for g in served}) == len(served)  # distinct
    assert all(version - birth_version(g, version) <= max_age for g in served)
    again = ReplayBuffer(capacity=64, max_age=max_age)
    for i, b in enumerate(births):
        again.add([group(f"g{i}", b)], b)
    assert [g.prompt.id for g in again.sample(n, np.random.default_rng(seed), version)] == \
        [g.prompt.id for g in served]  # deterministic given the generator


# -- none and share 0: on-policy -----------------------------------------------------------------
@pytest.mark.parametrize("method,options", [("none", {}), ("rollout_replay", {"share": 0.0}),
                                            ("remix", {"share": 0.0, "utd": 1})])
def test_share_zero_is_on_policy(method, options):
    replay = build(method, **options)
    for step in range(6):
        assert replay.fresh_prompts(4, step) == 4
        fresh = [group(f"s{step}g{i}", step) for i in range(4)]
        groups, _ = replay.compose(fresh, step=step, version=step)
        assert groups is fresh and all(a is b for a, b in zip(groups, fresh))
        assert replay.update_passes(step) == 1
    assert len(getattr(replay, "buffer", [])) == 0


def test_none_is_stateless_and_never_reincarnates():
    replay = build("none")
    assert replay.name == "none" and replay.state_dict() == {}
    assert not any(replay.reincarnate(s) for s in range(10))
    with pytest.raises(ValueError):
        replay.load_state_dict({"buffer": 1})


# -- rollout_replay --------------------------------------------------------------------------
def test_rollout_replay_share_respected():
    replay = build("rollout_replay")
    # step 0: the buffer is empty, all 4 fresh; from step 1: 4 - 4//2 = 2 fresh, 2 served
    for step in range(8):
        fresh, groups, m = run_step(replay, step)
        served = served_of(fresh, groups)
        assert len(groups) == 4
        assert len(fresh) == (4 if step == 0 else 2)
        assert len(served) == m["replay/served_groups"] == (0 if step == 0 else 2)
        assert m["replay/share"] == (0 if step == 0 else 0.5)
        assert all(step - birth_version(g, step) in (1, 2) for g in served)  # never its own step, never > 2 old
        assert m["replay/age_max"] <= 2


def test_rollout_replay_odd_batch_floors_the_share():
    replay = build("rollout_replay")
    run_step(replay, 0, n=5)
    assert replay.fresh_prompts(5, 1) == 3  # ⌊.5·5⌋ = 2 served


def test_rollout_replay_serves_what_it_can_while_the_buffer_fills():
    replay = build("rollout_replay", share=0.75)
    fresh, _, _ = run_step(replay, 0, n=2)  # 2 groups stored
    assert replay.fresh_prompts(8, 1) == 8 - 2  # ⌊.75·8⌋ = 6 wanted, 2 servable


def test_rollout_replay_nothing_older_than_the_age_limit_after_a_version_jump():
    replay = build("rollout_replay")  # max_age 2
    run_step(replay, 0)  # 4 groups born at version 0
    assert replay.fresh_prompts(4, 1) == 2
    fresh, groups, m = run_step(replay, 1, version=3)  # async: the policy moved 3 versions meanwhile
    assert served_of(fresh, groups) == [] and m["replay/served_groups"] == 0 and m["replay/expired_groups"] == 4


def test_rollout_replay_keeps_stored_logprobs_versions_and_advantages():
    replay = build("rollout_replay")
    run_step(replay, 0)
    fresh, groups, _ = run_step(replay, 1)
    for g in served_of(fresh, groups):
        for r in g.rollouts:
            assert r.versions == [0] * r.num_tokens and r.behavior_logprobs == [-0.5] * r.num_tokens
            assert r.advantage in ([1.0] * r.num_tokens, [-1.0] * r.num_tokens)


def test_rollout_replay_skips_zero_signal_groups():
    replay = build("rollout_replay")
    zero = group("zero", 0, scores=(1.0, 1.0), advantages=(0.0, 0.0))
    replay.compose([zero, group("live", 0)], step=0, version=0)
    assert [g.prompt.id for g in replay.buffer.drain(0)] == ["live"]


# -- remix -----------------------------------------------------------------------------------
def test_remix_utd_reincarnation_and_no_replay_after_it():
    replay = build("remix", total_steps=10)  # reincarnation at step ⌊.5·10⌋ = 5
    reincarnations = []
    for step in range(10):
        fresh, groups, m = run_step(replay, step)
        served = served_of(fresh, groups)
        reincarnations.append(replay.reincarnate(step))
        if step < 5:
            assert replay.update_passes(step) == 2
            assert len(fresh) == (4 if step == 0 else 2) and len(served) == (0 if step == 0 else 2)
            assert all(step - birth_version(g, step) <= 4 for g in served)
        else:
            assert replay.update_passes(step) == 1
            assert groups is fresh and len(fresh) == 4 and served == []
            assert len(replay.buffer) == 0
        if step == 5:
            assert m["replay/cleared_groups"] > 0
    assert reincarnations == [False] * 5 + [True] + [False] * 4


def test_remix_replays_from_the_last_four_versions():
    replay = build("remix", total_steps=100)
    seen = set()
    for step in range(12):
        fresh, groups, _ = run_step(replay, step)
        seen |= {step - birth_version(g, step) for g in served_of(fresh, groups)}
    assert seen == {1, 2, 3, 4}


def test_remix_objective():
    assert remix_objective(ReplayConfig(method="remix")) == {"beta": 0.02, "prox_kl_coef": 0.02}
    assert remix_objective(ReplayConfig(method="remix", remix={"beta": 0.1})) == {"beta": 0.05, "prox_kl_coef": 0.05}
    assert remix_objective(ReplayConfig(method="rollout_replay")) == {}
    assert remix_objective(ReplayConfig()) == {}


def test_remix_logs_length_and_reflection():
    replay = build("remix")
    fresh = [RolloutGroup(Prompt("a", "a"), [rollout(2, 1.0, text="Wait, let me redo"), rollout(4, 0.0, text="42")])]
    _, m = replay.compose(fresh, step=0, version=0)
    assert m["replay/length_fresh"] == 3.0 and m["replay/reflection_rate"] == 0.5


# -- the prox_kl term in policy_loss ------------------------------------------------------------
def _loss(coef: float, policy: torch.Tensor, old: torch.Tensor):
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.ones(1, 2)
    cfg = ObjectiveConfig(tis_mode="none", prox_kl_coef=coef, loss_agg="token_mean")
    return policy_loss(policy, old, adv, mask, token_weights(mask, "token_mean"), cfg)


def test_prox_kl_value_and_gradient_by_hand():
    old = torch.tensor([[-2.0, -2.0]])
    base_policy = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl_policy = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    base, base_m = _loss(0.0, base_policy, old)
    loss, m = _loss(0.1, kl_policy, old)
    base.backward()
    loss.backward()
    # δ = ℓ^old − ℓ^θ = [−1, 0]: k3 = [e^−1 − 1 + 1, 0] = [.3679, 0]; token_mean weights [.5, .5]
    assert float(m["kl_prox"]) == pytest.approx(math.exp(-1) / 2, abs=1e-6)
    assert float((loss - base).detach()) == pytest.approx(0.1 * 0.5 * math.exp(-1), abs=1e-6)
    # d k3 / d ℓ^θ = 1 − e^δ: [1 − e^−1, 0], × coef × weight
    extra = (kl_policy.grad - base_policy.grad).tolist()[0]
    assert extra == pytest.approx([0.1 * 0.5 * (1 - math.exp(-1)), 0.0], abs=1e-6)
    assert "kl_prox" not in base_m


def test_prox_kl_coef_zero_leaves_policy_loss_unchanged():
    policy = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.5]])
    loss0, m0 = _loss(0.0, policy, old)
    cfg = ObjectiveConfig(tis_mode="none", loss_agg="token_mean")  # no prox_kl_coef at all
    mask = torch.ones(1, 2)
    loss, m = policy_loss(policy, old, torch.tensor([[1.0, 1.0]]), mask, token_weights(mask, "token_mean"), cfg)
    assert float(loss0.detach()) == float(loss.detach()) and set(m0) == set(m)
    # on the first pass θ = old: the term is 0 with 0 gradient whatever the coefficient
    p = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    with_kl, m1 = _loss(0.5, p, p.detach())
    with_kl.backward()
    assert float(m1["kl_prox"]) == 0.0 and float(with_kl.detach()) == float(_loss(0.0, p, p.detach())[0].detach())
    assert p.grad.tolist() == [[-0.5, -0.5]]  # the policy term only: −A·ρ·weight, ρ = 1


def test_remix_without_replay_or_utd_is_the_base_algorithm():
    """share 0, UTD 1, beta 0: the same groups, one pass, and an objective equal to the base one."""
    replay = build("remix", share=0.0, utd=1, beta=0.0)
    fields = remix_objective(ReplayConfig(method="remix", remix={"share": 0.0, "utd": 1, "beta": 0.0}))
    assert ObjectiveConfig(**fields) == ObjectiveConfig()
    fresh = [group("a", 0), group("b", 0)]
    groups, _ = replay.compose(fresh, step=0, version=0)
    assert groups is fresh and replay.update_passes(0) == 1 and replay.fresh_prompts(4, 0) == 4


# -- rorecomp --------------------------------------------------------------------------------
def test_priority_mask_by_hand():
    # correct lengths 2, 4, 9 (median 4), incorrect 3, 8 (median 5.5)
    rs = [rollout(2, 1), rollout(4, 1), rollout(9, 1), rollout(3, 0), rollout(8, 0)]
    assert priority_mask(rs) == [True, True, False, False, True]
    assert priority_mask([rollout(5, 1), rollout(5, 1)]) == [True, True]  # equal lengths: at the median


@settings(max_examples=80, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), min_size=1, max_size=12))
def test_priority_set_holds_no_long_correct_or_short_incorrect(spec):
    rs = [rollout(n, float(ok)) for n, ok in spec]
    keep = priority_mask(rs)
    correct = sorted(r.num_tokens for r in rs if r.correct)
    incorrect = sorted(r.num_tokens for r in rs if not r.correct)
    for r, k in zip(rs, keep):
        if r.correct:  # kept iff no longer than the median correct
            assert k == (r.num_tokens <= float(np.median(correct)))
        else:
            assert k == (r.num_tokens >= float(np.median(incorrect)))
    g = RolloutGroup(Prompt("p", "p"), rs)
    p, q = split_group(g)
    parts = (p.rollouts if p else []) + (q.rollouts if q else [])
    assert sorted(map(id, parts)) == sorted(map(id, rs))  # a partition of the group


def test_rorecomp_each_response_lands_in_exactly_one_place():
    replay = build("rorecomp")  # compensation at steps 3 and 7
    every, trained, compensated = [], [], {}
    for step in range(8):
        fresh = [group(f"s{step}g{i}", step, lengths=(2, 4, 6, 3, 5), scores=(1, 1, 1, 0, 0),
                       advantages=(1, 1, 1, -1, -1)) for i in range(2)]
        every += [r for g in fresh for r in g.rollouts]
        before = {id(r) for g in replay.buffer.entries for r in g.group.rollouts}
        groups, m = replay.compose(fresh, step=step, version=step)
        now = [r for g in groups for r in g.rollouts]
        trained += now
        compensated[step] = sum(id(r) in before for r in now)
        buffered = {id(r) for g in replay.buffer.entries for r in g.group.rollouts} - before
        fresh_ids = {id(r) for g in fresh for r in g.rollouts}
        priority = {id(r) for r in now} & fresh_ids
        assert priority.isdisjoint(buffered) and priority | buffered == fresh_ids  # this step: one place each
        assert m["replay/priority_responses"] == 2 * 3  # 2, 4 correct (median 4); 5 incorrect (median 4)
    assert {s: c > 0 for s, c in compensated.items()} == {s: s in (3, 7) for s in range(8)}
    left = [r for e in replay.buffer.entries for r in e.group.rollouts]  # step 7's remainder, waiting
    places = [id(r) for r in trained + left]
    assert sorted(places) == sorted(map(id, every))  # over the run: each exactly once


def test_rorecomp_refuses_trees():
    g = group("t", 0)
    g.tree = Tree()
    with pytest.raises(ValueError, match="rollout.strategy=group"):
        build("rorecomp").compose([g], step=0, version=0)

    class Rollout_:
        strategy = "tree"

    with pytest.raises(ConfigError, match="rollout.strategy=group"):
        check_composition(ReplayConfig(method="rorecomp"), Rollout_())


# -- resume ----------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["rollout_replay", "remix", "rorecomp"])
def test_state_dict_round_trip_gives_identical_samples(method):
    def signature(groups):
        return [(g.prompt.id, tuple(r.num_tokens for r in g.rollouts), birth_version(g, -1)) for g in groups]

    a = build(method, total_steps=12)
    for step in range(4):
        run_step(a, step)
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    b = build(method, total_steps=12)
    b.load_state_dict(torch.load(blob, weights_only=False))
    for step in range(4, 12):
        _, ga, ma = run_step(a, step)
        _, gb, mb = run_step(b, step)
        assert signature(ga) == signature(gb) and ma == mb
        assert a.update_passes(step) == b.update_passes(step) and a.reincarnate(step) == b.reincarnate(step)


# -- config ----------------------------------------------------------------------------------
def test_config_is_strict_and_documented():
    assert set(ReplayConfig.model_fields["method"].annotation.__args__) == set(REPLAY_METHODS)
    with pytest.raises(Exception):
        ReplayConfig(method="remix", remix={"bta": 0.1})
    with pytest.raises(Exception):
        ReplayConfig(method="rollout_replay", rollout_replay={"share": 1.0})  # share < 1: someone must generate
    for name in REPLAY_METHODS:
        if name != "none":
            assert build(name).name == name
            for field, info in type(getattr(ReplayConfig(), name)).model_fields.items():
                assert info.description, f"replay.{name}.{field} has no description"


def test_replay_imports_only_config_and_types():
    root = Path(rollwise.__file__).parent / "replay"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollwise."):
                assert node.module.split(".")[1] in {"config", "types", "replay"}, (path.name, node.module)
