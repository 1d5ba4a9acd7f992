"""``tis_mis`` (behaviour-vs-trainer importance weights) and ``tree_adv`` (tree advantages,
each shared node trained once), with the loss-aggregation / batch plumbing they rely on.

Every expected number is worked out by hand in a comment next to it (METHODS.md cases first).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollwise.generate.forest import Tree
from rollwise.optim.advantages import group_advantages, reward_scale, tree_node_advantages
from rollwise.optim.batch import build_batch
from rollwise.optim.correction import behavior_weights
from rollwise.optim.losses import token_weights
from rollwise.optim.objective import ObjectiveConfig, assign_advantages, assign_tree_advantages, policy_loss
from rollwise.types import Prompt, Rollout, RolloutGroup

E = math.e  # 2.718281828...


def weights(gaps, mask=None, mode="token_truncate", cap=2.0, cap_min=0.0):
    """behavior_weights with old = gaps and behaviour log-probs 0, so log w = gap."""
    old = torch.tensor(gaps, dtype=torch.float32)
    mu = torch.zeros_like(old)
    m = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return behavior_weights(old, mu, m, mode, cap, cap_min)


# -- behavior_weights: the METHODS cases ---------------------------------------------------
def test_gap_of_one_token_truncate_caps_at_two():
    # w = exp(1) = 2.718 > C = 2  ->  min(w, 2) = 2
    w, stats = weights([[1.0]], mode="token_truncate", cap=2.0)
    assert w.tolist() == [[2.0]]
    assert float(stats["tis/truncated_tokens"]) == 1.0
    # below the cap it is left alone: C = 3 > 2.718
    w, stats = weights([[1.0]], mode="token_truncate", cap=3.0)
    assert float(w) == pytest.approx(E, abs=1e-6)
    assert float(stats["tis/truncated_tokens"]) == 0.0


def test_gap_of_one_token_mask():
    # C = 3: w = 2.718 <= 3 is kept as is (w · 1[w <= C] = w)
    w, stats = weights([[1.0]], mode="token_mask", cap=3.0)
    assert float(w) == pytest.approx(E, abs=1e-6)
    assert float(stats["tis/masked_tokens"]) == 0.0
    # C = 2: w = 2.718 > 2 -> masked to 0
    w, stats = weights([[1.0]], mode="token_mask", cap=2.0)
    assert w.tolist() == [[0.0]]
    assert float(stats["tis/masked_tokens"]) == 1.0


def test_three_gaps_of_half_sequence_modes():
    # Π w = exp(.5 + .5 + .5) = e^1.5 = 4.4817 > C = 3
    gaps = [[0.5, 0.5, 0.5]]
    w, stats = weights(gaps, mode="sequence_mask", cap=3.0)
    assert w.tolist() == [[0.0, 0.0, 0.0]]  # the whole sequence is dropped
    assert float(stats["tis/masked_sequences"]) == 1.0
    w, stats = weights(gaps, mode="sequence_truncate", cap=3.0)
    assert w.tolist() == [[3.0, 3.0, 3.0]]  # min(4.48, 3) on every token
    assert float(stats["tis/truncated_sequences"]) == 1.0
    # a cap above 4.48: sequence_mask keeps weight 1 (TRL's mask mode), sequence_truncate gives Π w
    w, _ = weights(gaps, mode="sequence_mask", cap=5.0)
    assert w.tolist() == [[1.0, 1.0, 1.0]]
    w, _ = weights(gaps, mode="sequence_truncate", cap=5.0)
    torch.testing.assert_close(w, torch.full((1, 3), math.exp(1.5)))  # 4.4817 each
    # the per-token modes see each w = e^.5 = 1.6487 < 2 and keep it
    w, _ = weights(gaps, mode="token_mask", cap=2.0)
    torch.testing.assert_close(w, torch.full((1, 3), math.exp(0.5)))


def test_cap_min_drops_sequences_below_it():
    # one token with gap −1: Π w = e^−1 = .3679
    gaps = [[-1.0, 0.0]]
    w, stats = weights(gaps, mode="sequence_mask", cap=3.0, cap_min=0.5)  # .368 < .5 -> dropped
    assert w.tolist() == [[0.0, 0.0]]
    assert float(stats["tis/masked_sequences"]) == 1.0
    w, _ = weights(gaps, mode="sequence_mask", cap=3.0, cap_min=0.3)  # .368 >= .3 -> kept
    assert w.tolist() == [[1.0, 1.0]]
    w, _ = weights(gaps, mode="sequence_mask", cap=3.0)  # default cap_min 0: kept
    assert w.tolist() == [[1.0, 1.0]]


def test_none_mode_is_all_ones_and_no_stats():
    w, stats = weights([[5.0, -5.0]], mode="none", cap=2.0)
    assert w.tolist() == [[1.0, 1.0]] and stats == {"mismatch/truncated_frac": 0.0}  # nothing cut


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="tis_mode"):
        weights([[0.0]], mode="bogus", cap=2.0)


@pytest.mark.parametrize("mode", ["sequence_clip", "token_clip", "tokens"])
def test_misspelt_mode_with_a_known_prefix_is_an_error(mode):
    with pytest.raises(ValueError, match="tis_mode"):
        weights([[1.0]], mode=mode, cap=2.0)


# -- padding ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_padding_weight_is_one_and_padding_gap_does_not_count(mode):
    # real tokens: gaps .5, .5 (Π w = e^1 = 2.718 < C = 3); the padding column holds gap 10,
    # which counted would make Π w = e^11 and mask / truncate the sequence.
    w, _ = weights([[0.5, 0.5, 10.0]], mask=[[1, 1, 0]], mode=mode, cap=3.0)
    assert float(w[0, 2]) == 1.0  # off the mask
    expected_real = {
        "token_truncate": math.exp(0.5),  # 1.6487 < 3, untouched
        "token_mask": math.exp(0.5),
        "sequence_truncate": E,  # Π w over the real tokens only = e^(.5+.5)
        "sequence_mask": 1.0,  # inside [0, 3]: kept with weight 1
    }[mode]
    torch.testing.assert_close(w[0, :2], torch.full((2,), expected_real))


def test_weights_carry_no_gradient():
    old = torch.tensor([[0.3, -0.2, 1.0]], requires_grad=True)
    mu = torch.tensor([[0.0, 0.1, 0.0]], requires_grad=True)
    mask = torch.ones(1, 3)
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "none"):
        w, stats = behavior_weights(old, mu, mask, mode, 3.0)
        assert not w.requires_grad and w.grad_fn is None, mode
        assert all(not v.requires_grad for v in stats.values()), mode


# -- property: truncation never exceeds the cap -------------------------------------------
gap_rows = st.lists(st.lists(st.floats(-6, 6, allow_nan=False), min_size=4, max_size=4), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None)
@given(gaps=gap_rows, cap=st.floats(1.0, 10.0), mask_bits=st.lists(st.booleans(), min_size=16, max_size=16))
def test_truncate_modes_never_exceed_the_cap(gaps, cap, mask_bits):
    old = torch.tensor(gaps, dtype=torch.float64)
    mask = torch.tensor(mask_bits[: old.numel()], dtype=torch.float64).reshape(old.shape)
    mu = torch.zeros_like(old)
    for mode in ("token_truncate", "sequence_truncate"):
        w, _ = behavior_weights(old, mu, mask, mode, cap)
        on = mask.bool()
        assert (w[on] <= cap).all(), (mode, w, cap)
        assert (w[on] > 0).all()
        assert (w[~on] == 1).all()  # padding is never weighted
    # token_truncate is exactly min(exp(gap), C) on the mask
    w, _ = behavior_weights(old, mu, mask, "token_truncate", cap)
    expected = torch.where(mask.bool(), old.exp().clamp(max=cap), torch.ones_like(old))
    torch.testing.assert_close(w, expected)
    # sequence_truncate: one weight per row = min(exp(Σ gaps on the mask), C)
    w, _ = behavior_weights(old, mu, mask, "sequence_truncate", cap)
    seq = ((old * mask).sum(-1)).exp().clamp(max=cap)
    torch.testing.assert_close(w, torch.where(mask.bool(), seq[:, None].expand_as(old), torch.ones_like(old)))


# -- stats on a small batch ---------------------------------------------------------------
# row 0: gaps [1, 0, 0], all real           -> token w = [e, 1, 1],  Π w = e
# row 1: gaps [0, 0, (pad)], 2 real tokens  -> token w = [1, 1],     Π w = 1
# row 2: no real token at all (ignored by the sequence counts)
GAPS = [[1.0, 0.0, 0.0], [0.0, 0.0, 7.0], [3.0, 3.0, 3.0]]
MASK = [[1, 1, 1], [1, 1, 0], [0, 0, 0]]  # 5 real tokens, 2 sequences with tokens


@pytest.mark.parametrize(
    "mode, key, hit, weight_mean, cut, row0, row1",
    [
        # truncated at C=2: row0 [2,1,1]; 1 of 5 tokens hit (the share cut: 1/5); mean (2+1+1+1+1)/5 = 1.2
        ("token_truncate", "tis/truncated_tokens", 1 / 5, 6 / 5, 1 / 5, [2, 1, 1], [1, 1, 1]),
        # masked at C=2: row0 [0,1,1]; mean (0+1+1+1+1)/5 = .8
        ("token_mask", "tis/masked_tokens", 1 / 5, 4 / 5, 1 / 5, [0, 1, 1], [1, 1, 1]),
        # Π w: row0 e > 2 -> 2 on its 3 tokens; row1 1; mean (2·3 + 1·2)/5 = 1.6; 1 of 2 sequences hit, whose
        # 3 tokens are 3/5 of the tokens cut
        ("sequence_truncate", "tis/truncated_sequences", 1 / 2, 8 / 5, 3 / 5, [2, 2, 2], [1, 1, 1]),
        # row0 dropped, row1 kept: mean (0·3 + 1·2)/5 = .4
        ("sequence_mask", "tis/masked_sequences", 1 / 2, 2 / 5, 3 / 5, [0, 0, 0], [1, 1, 1]),
    ],
)
def test_stats_on_a_small_batch(mode, key, hit, weight_mean, cut, row0, row1):
    w, stats = weights(GAPS, mask=MASK, mode=mode, cap=2.0)
    assert set(stats) == {key, "tis/weight_mean", "mismatch/truncated_frac"}
    assert float(stats[key]) == pytest.approx(hit)
    assert float(stats["mismatch/truncated_frac"]) == pytest.approx(cut)
    assert float(stats["tis/weight_mean"]) == pytest.approx(weight_mean)
    assert w[0].tolist() == row0 and w[1].tolist() == row1
    assert w[2].tolist() == [1.0, 1.0, 1.0]  # all padding


# -- ObjectiveConfig and policy_loss ------------------------------------------------------
def test_objective_config_tis_and_tree_defaults():
    cfg = ObjectiveConfig()
    assert cfg.tis_mode == "sequence_mask" and cfg.tis_cap == 3.0 and cfg.tis_cap_min == 0.0
    assert cfg.tree_adv is True and cfg.tree_mix == 0.5
    assert ObjectiveConfig(tis_mode="token_truncate").tis_cap == 2.0
    assert ObjectiveConfig(tis_mode="token_mask").tis_cap == 2.0
    assert ObjectiveConfig(tis_mode="sequence_truncate").tis_cap == 3.0
    assert ObjectiveConfig(tis_mode="token_mask", tis_cap=5.0).tis_cap == 5.0  # explicit cap wins
    with pytest.raises(ValidationError):
        ObjectiveConfig(tree_mix=1.5)
    with pytest.raises(ValidationError):
        ObjectiveConfig(tis_mode="bogus")


# 1x3 case. old = −1 everywhere, behaviour μ = [−2, −1, −1.5] -> gaps [1, 0, .5]
#   token_truncate, C = 2: w = [min(e, 2), 1, e^.5] = [2, 1, 1.64872]
# policy = old + [.1, 0, 0] -> ratio ρ = [e^.1, 1, 1] = [1.10517, 1, 1], inside the clip [.8, 1.2]
# advantages A = [1, −2, .5]; per-token plain loss −ρ·A = [−1.10517, 2, −.5]
# token_mean weights 1/3 each:
#   plain    = (−1.10517 + 2 − .5)/3                        = .39483/3  = .131610
#   weighted = (−1.10517·2 + 2·1 − .5·1.64872)/3 = (−2.21034 + 2 − .82436)/3 = −1.03470/3 = −.344900
OLD = torch.tensor([[-1.0, -1.0, -1.0]])
MU = torch.tensor([[-2.0, -1.0, -1.5]])
ADV = torch.tensor([[1.0, -2.0, 0.5]])
MASK3 = torch.ones(1, 3)


def _loss(cfg, behavior, policy=None):
    policy = (OLD + torch.tensor([[0.1, 0.0, 0.0]])) if policy is None else policy
    lw = token_weights(MASK3, "token_mean")
    return policy_loss(policy, OLD, ADV, MASK3, lw, cfg, behavior_logprobs=behavior)


def test_policy_loss_token_truncate_weights_each_token():
    cfg = ObjectiveConfig(method="ppo_clip", tis_mode="token_truncate")  # token_mean, C = 2
    plain, _ = _loss(cfg, None)
    assert float(plain) == pytest.approx(0.131610, abs=1e-5)
    policy = (OLD + torch.tensor([[0.1, 0.0, 0.0]])).requires_grad_(True)
    loss, metrics = _loss(cfg, MU, policy)
    assert float(loss.detach()) == pytest.approx(-0.344900, abs=1e-5)
    # == the plain per-token loss times the weights, summed with the same loss weights
    w = torch.tensor([[2.0, 1.0, math.exp(0.5)]])
    rho = torch.exp(torch.tensor([[0.1, 0.0, 0.0]]))
    assert float(loss.detach()) == pytest.approx(float((-rho * ADV * w).sum() / 3), abs=1e-6)
    assert float(metrics["tis/truncated_tokens"]) == pytest.approx(1 / 3)
    # the weight scales the gradient and is not differentiated: d/dℓ0 = −ρ0·A0·w0/3 = −1.10517·2/3 = −.73678
    loss.backward()
    assert float(policy.grad[0, 0]) == pytest.approx(-1.10517 * 2 / 3, abs=1e-4)
    assert float(policy.grad[0, 2]) == pytest.approx(-0.5 * math.exp(0.5) / 3, abs=1e-5)  # −.27479


def test_policy_loss_none_ignores_behavior_and_default_masks():
    plain, _ = _loss(ObjectiveConfig(method="ppo_clip", tis_mode="none"), None)
    with_mu, metrics = _loss(ObjectiveConfig(method="ppo_clip", tis_mode="none"), MU)
    assert float(with_mu) == float(plain) and not any(k.startswith("tis/") for k in metrics)
    # the default sequence_mask at C = 3: Π w = e^(1 + 0 + .5) = 4.48 > 3 -> the sequence is dropped
    masked, metrics = _loss(ObjectiveConfig(method="ppo_clip"), MU)
    assert float(masked) == 0.0 and float(metrics["tis/masked_sequences"]) == 1.0
    # behaviour = old (on-policy): the default leaves the loss exactly unchanged
    same, _ = _loss(ObjectiveConfig(method="ppo_clip"), OLD.clone())
    assert float(same) == float(plain)


# -- tree_node_advantages -----------------------------------------------------------------
# METHODS: root(0) -> a(1) with leaves 3, 4 (rewards 1, 1) and b(2) with leaves 5, 6 (0, 1)
PARENTS = {0: None, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2}
LEAVES, REWARDS = [3, 4, 5, 6], [1.0, 1.0, 0.0, 1.0]
# V: a = 1, b = .5, root = .75, leaves = their reward
# global V(n) − V(root): a .25, b −.25, leaves [.25, .25, −.75, .25]
GLOBAL = {1: 0.25, 2: -0.25, 3: 0.25, 4: 0.25, 5: -0.75, 6: 0.25}
# local V(n) − V(parent): a .25, b −.25, leaves 1−1, 1−1, 0−.5, 1−.5
LOCAL = {1: 0.25, 2: -0.25, 3: 0.0, 4: 0.0, 5: -0.5, 6: 0.5}


def test_tree_node_advantages_methods_case():
    for mix, expected in [(0.0, GLOBAL), (1.0, LOCAL),
                          (0.5, {n: (GLOBAL[n] + LOCAL[n]) / 2 for n in GLOBAL})]:
        adv = tree_node_advantages(PARENTS, LEAVES, REWARDS, mix)
        assert set(adv) == set(GLOBAL)  # every node but the root
        for n, v in expected.items():
            assert adv[n] == pytest.approx(v, abs=1e-12), (mix, n)
    # the mix=.5 values by hand: leaves .125, .125, −.625, .375
    adv = tree_node_advantages(PARENTS, LEAVES, REWARDS)
    assert [adv[n] for n in LEAVES] == pytest.approx([0.125, 0.125, -0.625, 0.375])


def test_leaf_global_term_is_grpo_mean_centring():
    adv = tree_node_advantages(PARENTS, LEAVES, REWARDS, mix=0.0)
    grpo = group_advantages(torch.tensor(REWARDS), torch.zeros(4, dtype=torch.long), "none")
    assert [adv[n] for n in LEAVES] == pytest.approx(grpo.tolist())  # [.25, .25, −.75, .25]


def test_tree_node_advantages_deeper_tree_separates_global_and_local():
    # root(0) -> a(1) -> {leaf 3 (r 1), c(2) -> {leaf 4 (r 1), leaf 5 (r 0)}};  root -> leaf 6 (r 0)
    # V(c) = .5, V(a) = 2/3, V(root) = .5
    # global: a 1/6, c 0,  3 .5,  4 .5, 5 −.5, 6 −.5
    # local:  a 1/6, c .5 − 2/3 = −1/6, 3 1 − 2/3 = 1/3, 4 .5, 5 −.5, 6 −.5
    parents = {0: None, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 0, 7: 0}  # node 7: a pruned branch, no leaf
    leaves, rewards = [3, 4, 5, 6], [1.0, 1.0, 0.0, 0.0]
    glob = {1: 1 / 6, 2: 0.0, 3: 0.5, 4: 0.5, 5: -0.5, 6: -0.5}
    loc = {1: 1 / 6, 2: -1 / 6, 3: 1 / 3, 4: 0.5, 5: -0.5, 6: -0.5}
    for mix in (0.0, 0.3, 1.0):
        adv = tree_node_advantages(parents, leaves, rewards, mix)
        assert set(adv) == set(glob)  # no entry for the leafless node 7 nor the root
        for n, g in glob.items():
            assert adv[n] == pytest.approx((1 - mix) * g + mix * loc[n], abs=1e-12), (mix, n)


def test_reward_scale_modes():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 3.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: mean .75, Σ(r − mean)² = 3·.0625 + .5625 = .75, / (4 − 1) = .25 -> std .5
    # group 1: mean 4, Σ = 1 + 1 = 2, / 1 -> std 1.41421
    expected = [0.5 + 1e-6] * 4 + [math.sqrt(2) + 1e-6] * 2
    assert reward_scale(r, g, "group").tolist() == pytest.approx(expected, abs=1e-7)
    assert reward_scale(r, g, "none").tolist() == [1.0] * 6
    # batch std (Bessel): mean 11/6; Σ(r − mean)² = 3·(5/6)² + (11/6)² + (7/6)² + (19/6)² = 101/6 -> var 101/30
    assert reward_scale(r, g, "batch").tolist() == pytest.approx([math.sqrt(101 / 30) + 1e-6] * 6, abs=1e-6)


# -- assign_advantages on a hand-built tree ----------------------------------------------
# root 0 ─ a(1) [0,2) ─ a1(3) [2,4)   leaf, reward 1, tokens 10 11 | 12 13
#        │          └ a2(4) [2,3)   leaf, reward 1, tokens 10 11 | 14
#        └ b(2) [0,1) ─ b1(5) [1,3)   leaf, reward 0, tokens 20 | 21 22
#                   └ b2(6) [1,2)   leaf, reward 1, tokens 20 | 23
# node tokens: a 2 + a1 2 + a2 1 + b 1 + b1 2 + b2 1 = 9 unique; leaf tokens 4 + 3 + 3 + 2 = 12.
# Node advantages (mix .5, see above): a .25, b −.25, a1 .125, a2 .125, b1 −.625, b2 .375.
SPANS = {1: (0, 2), 2: (0, 1), 3: (2, 4), 4: (2, 3), 5: (1, 3), 6: (1, 2)}
TOKENS = {1: [10, 11], 2: [20], 3: [12, 13], 4: [14], 5: [21, 22], 6: [23]}
LEAF_REWARD = {3: 1.0, 4: 1.0, 5: 0.0, 6: 1.0}
NODE_ADV = {1: 0.25, 2: -0.25, 3: 0.125, 4: 0.125, 5: -0.625, 6: 0.375}


def make_tree():
    tree = Tree()
    for parent, node in [(0, 1), (0, 2), (1, 3), (1, 4), (2, 5), (2, 6)]:
        assert tree.add(parent, SPANS[node][0]) == node
        tree.nodes[node].end = SPANS[node][1]
    return tree


def make_leaf(tree, leaf, loss_weights=None):
    path = tree.path(leaf)
    ids = [t for n in path[1:] for t in TOKENS[n]]
    return Rollout(prompt_id="p", prompt_ids=[1], completion_ids=ids, behavior_logprobs=[-0.5] * len(ids),
                   versions=[0] * len(ids), finish_reason="stop", reward=LEAF_REWARD[leaf], node_path=path,
                   loss_weights=loss_weights)


def tree_group(order=(3, 4, 5, 6), masks=None):
    tree = make_tree()
    masks = masks or {}
    rollouts = [make_leaf(tree, leaf, masks.get(leaf)) for leaf in order]
    return RolloutGroup(prompt=Prompt(id="p", text="x", token_ids=[1]), rollouts=rollouts, tree=tree)


def flat_group():
    rollouts = [Rollout(prompt_id="q", prompt_ids=[1], completion_ids=[5] * n, behavior_logprobs=[-1.0] * n,
                        versions=[0] * n, finish_reason="stop", reward=r) for n, r in [(3, 1.0), (2, 0.0)]]
    return RolloutGroup(prompt=Prompt(id="q", text="y", token_ids=[1]), rollouts=rollouts)


def test_hand_built_tree_is_consistent():
    g = tree_group()
    assert g.tree.unique_tokens == 9
    assert [r.completion_ids for r in g.rollouts] == [[10, 11, 12, 13], [10, 11, 14], [20, 21, 22], [20, 23]]


def expected_advantage(rollout, scale):
    out = [None] * len(rollout.completion_ids)
    for n in rollout.node_path[1:]:
        s, e = SPANS[n]
        out[s:e] = [NODE_ADV[n] / scale] * (e - s)
    return out


@pytest.mark.parametrize("scale_rewards, scale", [("none", 1.0), ("group", 0.5 + 1e-6)])
def test_tree_advantages_per_token_and_each_node_trained_once(scale_rewards, scale):
    # group std of leaf rewards [1, 1, 0, 1]: .5 (see test_reward_scale_modes), so "group" divides by .500001
    g = tree_group()
    assign_advantages([g], ObjectiveConfig(scale_rewards=scale_rewards))
    by_leaf = {r.node_path[-1]: r for r in g.rollouts}
    for r in g.rollouts:
        assert r.advantage == pytest.approx(expected_advantage(r, scale), abs=1e-9)
    # by hand, unscaled: leaf a1 [.25, .25, .125, .125], leaf b1 [−.25, −.625, −.625]
    assert by_leaf[3].advantage == pytest.approx([0.25 / scale] * 2 + [0.125 / scale] * 2)
    assert by_leaf[5].advantage == pytest.approx([-0.25 / scale] + [-0.625 / scale] * 2)
    # a is trained in leaf 3 (first), b in leaf 5 (first), each with weight 2 (two leaves below);
    # leaves 4 and 6 skip those spans
    assert by_leaf[3].loss_weights == [2, 2, 1, 1]
    assert by_leaf[4].loss_weights == [0, 0, 1]
    assert by_leaf[5].loss_weights == [2, 1, 1]
    assert by_leaf[6].loss_weights == [0, 1]
    # every unique token once (9 nonzero entries), weights adding up to the leaves' 4+3+3+2 = 12 tokens
    assert sum(m > 0 for r in g.rollouts for m in r.loss_weights) == g.tree.unique_tokens == 9
    assert sum(sum(r.loss_weights) for r in g.rollouts) == sum(len(r.completion_ids) for r in g.rollouts) == 12


def test_shared_node_is_trained_in_the_first_leaf_in_rollout_order():
    g = tree_group(order=(6, 5, 4, 3))
    assign_advantages([g], ObjectiveConfig(scale_rewards="none"))
    masks = {r.node_path[-1]: r.loss_weights for r in g.rollouts}
    assert masks == {6: [2, 1], 5: [0, 1, 1], 4: [2, 2, 1], 3: [0, 0, 1, 1]}
    assert sum(sum(m) for m in masks.values()) == 12


def test_forced_token_stays_masked():
    # leaf b2's token at position 1 was placed by fork(replace_last=...) (forced): loss_weights [1, 0]
    g = tree_group(masks={6: [1, 0]})
    assign_advantages([g], ObjectiveConfig(scale_rewards="none"))
    masks = {r.node_path[-1]: r.loss_weights for r in g.rollouts}
    assert masks[6] == [0, 0]  # b was trained in leaf 5; the forced token stays 0
    assert sum(sum(m) for m in masks.values()) == 12 - 1
    # the forced token still carries its node's advantage (the mask, not the advantage, drops it)
    leaf6 = next(r for r in g.rollouts if r.node_path[-1] == 6)
    assert leaf6.advantage == pytest.approx([-0.25, 0.375])


def test_assign_tree_advantages_directly():
    g = tree_group()
    assign_tree_advantages(g, 2.0, 1.0)  # local terms only, divided by 2
    leaf4 = next(r for r in g.rollouts if r.node_path[-1] == 4)
    # local: a .25, a2 1 − 1 = 0
    assert leaf4.advantage == pytest.approx([0.125, 0.125, 0.0])
    leaf6 = next(r for r in g.rollouts if r.node_path[-1] == 6)
    # local: b −.25, b2 1 − .5 = .5
    assert leaf6.advantage == pytest.approx([-0.125, 0.25])


def test_tree_adv_off_gives_flat_grpo_and_leaves_loss_weights_alone():
    g = tree_group(masks={6: [1, 0]})
    assign_advantages([g], ObjectiveConfig(scale_rewards="none", tree_adv=False))
    # flat GRPO, mean-centred: rewards [1, 1, 0, 1] - .75
    for r, a in zip(g.rollouts, [0.25, 0.25, -0.75, 0.25]):
        assert r.advantage == pytest.approx([a] * len(r.completion_ids))
    assert [r.loss_weights for r in g.rollouts] == [None, None, None, [1, 0]]


def test_flat_group_in_the_same_batch_is_unaffected():
    # flat rewards [1, 0]: mean .5, std sqrt(.5/1) = .70711 -> ±.5/(.70711 + 1e-6) = ±.707106
    alone = flat_group()
    assign_advantages([alone], ObjectiveConfig())
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert alone.rollouts[0].advantage == pytest.approx([a] * 3, abs=1e-6)
    assert alone.rollouts[1].advantage == pytest.approx([-a] * 2, abs=1e-6)
    t, f = tree_group(), flat_group()
    metrics = assign_advantages([t, f], ObjectiveConfig())
    assert [r.advantage for r in f.rollouts] == [r.advantage for r in alone.rollouts]
    assert [r.loss_weights for r in f.rollouts] == [None, None]
    # the tree group, scaled by its own std .5: leaf a1 [.25, .25, .125, .125] / .500001
    assert t.rollouts[0].advantage == pytest.approx([0.25 / 0.500001] * 2 + [0.125 / 0.500001] * 2, abs=1e-9)
    assert metrics["groups/zero_signal"] == 0.0


# -- token_weights with lengths; build_batch with loss_weights -------------------------------
def test_seq_mean_token_mean_with_lengths():
    # row 0: a 4-token sequence whose first 2 tokens are trained elsewhere; row 1: 2 tokens
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    lengths = torch.tensor([4, 2])
    # with lengths, N = 2: row 0 1/(4·2) = 1/8 on its trained tokens, row 1 1/(2·2) = 1/4
    w = token_weights(mask, "seq_mean_token_mean", lengths=lengths)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1 / 8, 1 / 8], [1 / 4, 1 / 4, 0.0, 0.0]]))
    # without lengths |y_0| = Σ m_0 = 2: 1/(2·2) = 1/4 (the old behaviour)
    w = token_weights(mask, "seq_mean_token_mean")
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1 / 4, 1 / 4], [1 / 4, 1 / 4, 0.0, 0.0]]))
    # lengths equal to Σ m reproduce it exactly
    torch.testing.assert_close(token_weights(mask, "seq_mean_token_mean", lengths=torch.tensor([2, 2])), w)


def test_build_batch_keeps_the_completion_mask_and_loss_weights_apart():
    def rollout(ids, loss_weights=None, reason="stop"):
        n = len(ids)
        return Rollout(prompt_id="p", prompt_ids=[1, 2], completion_ids=ids, behavior_logprobs=[-1.0] * n,
                       versions=[0] * n, finish_reason=reason, advantage=[1.0] * n, loss_weights=loss_weights)

    g = RolloutGroup(prompt=Prompt(id="p", text="x", token_ids=[1, 2]),
                     rollouts=[rollout([5, 6, 7], [1, 0, 1]), rollout([5]), rollout([8, 9], [0, 1], "length")])
    b = build_batch([g], pad_token_id=0)
    # width 2 + 3 = 5 -> 4 columns; column p − 1 = 1 scores the first completion token
    assert b.completion_mask.tolist() == [[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]]  # every completion token
    assert b.loss_weights.tolist() == [[0, 1, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0]]  # what is trained
    assert b.advantages.tolist() == [[0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]]  # advantages are not masked
    assert b.completion_lengths.tolist() == [3, 1, 2]
    b = build_batch([g], pad_token_id=0, mask_truncated=True)
    assert b.loss_weights[2].tolist() == [0, 0, 0, 0]  # truncated: nothing trained
    assert b.loss_weights[0].tolist() == [0, 1, 0, 1]
    assert b.completion_mask[2].tolist() == [0, 1, 1, 0]


def test_build_batch_on_a_tree_group_trains_each_unique_token_once():
    g = tree_group(masks={6: [1, 0]})
    assign_advantages([g], ObjectiveConfig(scale_rewards="none"))
    b = build_batch([g], pad_token_id=0)
    assert int((b.loss_weights > 0).sum()) == g.tree.unique_tokens - 1  # 9 unique, one forced
    assert int(b.loss_weights.sum()) == 12 - 1  # weights: shared nodes count for both their leaves
    assert int(b.completion_mask.sum()) == 12  # the 0/1 mask: every leaf's tokens, shared or not
    assert b.completion_lengths.tolist() == [4, 3, 3, 2]  # lengths keep the masked tokens
