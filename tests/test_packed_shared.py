"""Shared-prompt packing (``share_prompts``): rows with identical prompt ids compute the prompt
once, and nothing changes — log-probs, entropies and every parameter's gradient equal the
unshared packed forward's and the HF module's; the counters show prompts really were shared.

- the forward, per model shape (tied head and q/k/v biases, GQA, a sliding window), groups of
  several sizes, prompt and completion lengths beside unshared rows, a unit split over bins,
  chunked LM head and a top-k distribution; LoRA adapters (factored) too;
- the layout itself: every real token reads a computed token with its own id and position,
  and sees exactly its own row's earlier tokens (a property test over random groups);
- the update: ``policy_update`` with ``share_prompts`` on and off gives the same loss, metrics
  and gradients (old and reference log-probs included), and logs the prompt tokens spared.
"""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_lora import lora_tiny
from test_packed import MODELS

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.model.packed import Packing, PackedForward, choose_capacity, shared_units
from rollwise.optim.batch import TrainBatch
from rollwise.optim.objective import ObjectiveConfig
from rollwise.optim.update import UpdateSpec, policy_update

# (prompt length, completion lengths) per group: 4, 2, 8 rows sharing a prompt, and a lone row
GROUPS = [(7, [3, 5, 1, 4]), (4, [6, 2]), (5, [3] * 8), (9, [2])]
SHARED = 3 * 7 + 1 * 4 + 7 * 5  # (rows - 1) × prompt of each group
# bins of 16 tokens: (5, [3]*8) splits into parts of 3, 3 and 2 rows, (7, [3, 5, 1, 4]) into [5, 4] and [3, 1]
SHARED_IN_BINS_OF_16 = 5 * (2 + 2 + 1) + 7 * (1 + 1) + 4


def chat_batch(vocab: int, groups=GROUPS, loners: int = 3, seed: int = 0):
    """Right-padded ids [B, T], attention mask and completion columns: each group's rows repeat
    one random prompt before their own completions; ``loners`` rows with prompts of their own
    follow (one a prompt of the first group with its last token changed, one that prompt and a
    token more: near misses that must not share)."""
    gen = torch.Generator().manual_seed(seed)
    rows: list[tuple[list[int], list[int]]] = []
    prompts = []
    for prompt_len, completions in groups:
        prompt = torch.randint(3, vocab, (prompt_len,), generator=gen).tolist()
        prompts.append(prompt)
        rows += [(prompt, torch.randint(3, vocab, (n,), generator=gen).tolist()) for n in completions]
    near = [prompts[0][:-1] + [prompts[0][-1] % (vocab - 3) + 3], prompts[0] + [4]]
    for i in range(loners):
        prompt = near[i] if i < len(near) else torch.randint(3, vocab, (6,), generator=gen).tolist()
        rows.append((prompt, torch.randint(3, vocab, (4,), generator=gen).tolist()))
    order = torch.randperm(len(rows), generator=gen).tolist()  # groups need not be contiguous
    rows = [rows[i] for i in order]
    T = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    scored = torch.zeros(len(rows), T - 1)
    for r, (p, c) in enumerate(rows):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        attn[r, : len(p) + len(c)] = 1
        scored[r, len(p) - 1 : len(p) + len(c) - 1] = 1
    return ids, attn, scored


def _three_ways(model, ids, attn, scored, capacity=None, **kw):
    """{path: (log-probs, entropies, gradients)} for the HF forward and the packed one, shared or not."""
    weights = torch.rand(scored.shape, generator=torch.Generator().manual_seed(5)) + 0.5  # rows count differently
    out, counts = {}, {}
    for path in ("hf", "unshared", "shared"):
        m = copy.deepcopy(model)
        if path == "hf":
            lp, ent = token_logprobs_and_entropy(m, ids, attn, **kw)
        else:
            forward = PackedForward(m)
            lp, ent = forward.logprobs(ids, attn, scored, capacity=capacity, share_prompts=path == "shared", **kw)
            counts[path] = forward.prompt_tokens_shared
        (lp * scored * weights).sum().backward()
        out[path] = (lp.detach() * scored, ent * scored,
                     {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    return out, counts


def _assert_same(out):
    scale = max(float(g.abs().max()) for g in out["hf"][2].values())
    for path in ("unshared", "shared"):
        torch.testing.assert_close(out[path][0], out["hf"][0], rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(out[path][1], out["hf"][1], rtol=1e-5, atol=2e-5)
        assert out[path][2].keys() == out["hf"][2].keys()
        for n, g in out["hf"][2].items():
            torch.testing.assert_close(out[path][2][n], g, rtol=1e-3, atol=1e-4 * scale, msg=f"{path} {n}")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("capacity, shared", [(29, SHARED), (16, SHARED_IN_BINS_OF_16), (None, None)])
def test_shared_prompts_change_nothing(name, capacity, shared):
    model = MODELS[name]()
    ids, attn, scored = chat_batch(model.config.vocab_size)
    out, counts = _three_ways(model, ids, attn, scored, capacity=capacity)
    assert counts["unshared"] == 0  # the prompts really were computed once per unit:
    assert counts["shared"] == shared if capacity else 0 < counts["shared"] <= SHARED  # 29 fits the widest group
    _assert_same(out)
    assert all(g.abs().sum() > 0 for n, g in out["shared"][2].items() if "bias" not in n)


@pytest.mark.parametrize("options", [{"chunk": 3}, {"temperature": 0.7, "top_k": 5}])
@pytest.mark.parametrize("groups", [[(1, [4, 4, 4])], [(12, [1, 1])], [(3, [9, 1, 6, 2, 2, 7])]])
def test_shared_prompts_change_nothing_at_any_length(options, groups):
    model = MODELS["llama"]()
    ids, attn, scored = chat_batch(model.config.vocab_size, groups, loners=1, seed=len(groups[0][1]))
    out, counts = _three_ways(model, ids, attn, scored, capacity=40, **options)
    prompt, completions = groups[0]
    assert counts["shared"] == prompt * (len(completions) - 1)
    _assert_same(out)


def test_shared_prompts_under_lora():
    model = lora_tiny(target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])[0]
    ids, attn, scored = chat_batch(model.config.vocab_size)
    out, counts = _three_ways(model, ids, attn, scored, capacity=29)
    assert counts["shared"] == SHARED
    assert out["shared"][2] and all("lora_" in n for n in out["shared"][2])  # only the adapters train
    _assert_same(out)


def test_units_are_identical_prompts_only():
    ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9], [5, 6, 4, 8, 0], [5, 6, 7, 8, 1], [5, 6, 7, 3, 0]])
    attn = (ids != 0).long()
    scored = torch.zeros(5, 4)
    scored[[0, 1, 2], 2:] = 1  # prompts [5, 6, 7] (rows 0, 1) and [5, 6, 4] (row 2)
    scored[3, 3] = 1  # prompt [5, 6, 7, 8]: starts like rows 0 and 1, but is longer
    scored *= attn[:, 1:]  # row 4 scores nothing: it stays whole
    units = shared_units(ids, attn, scored)
    assert units == [(3, [0, 1]), (3, [2]), (4, [3]), (4, [4])]
    p = Packing.build(attn, units=units)
    assert p.shared == 3 and len(p.dest) == int(attn.sum()) - 3
    assert p.index[1, :3].tolist() == p.index[0, :3].tolist() and p.index[1, 3] != p.index[0, 3]


def test_bins_share_prompts_only_when_it_pays():
    # SmolLM2-135M: 9 heads of 64, 3.54 M weights per layer -> one attention pair costs 3.3e-4 of a token
    pair = 2 * 9 * 64 / (576 * (576 + 2 * 192 + 576) + 3 * 576 * 1536)
    chat = [(50, list(range(8)))]  # a group of 8 repeating a 50-token chat prompt
    assert choose_capacity(chat, [65] * 8, pair) == 170  # short completions: the whole group in one bin
    assert choose_capacity(chat, [550] * 8, pair) == 550  # long ones: bins 4x wider cost more than 7% saved
    assert choose_capacity(chat, [550] * 8, 0.0) == 4 * 550  # without attention cost: as much as may be shared
    lengths = [65] * 4 + [20] * 4
    alone = [(n, [r]) for r, n in enumerate(lengths)]
    assert choose_capacity(alone, lengths, pair) == 65  # nothing shared: the longest row, as unshared


@st.composite
def _layouts(draw):
    groups = draw(st.lists(st.tuples(st.integers(1, 6), st.lists(st.integers(0, 5), min_size=1, max_size=5)),
                           min_size=1, max_size=5))
    return groups, draw(st.integers(0, 12)), draw(st.sampled_from([None, 2, 3]))


@given(_layouts())
def test_every_token_sees_exactly_its_own_row(layout):
    groups, extra, window = layout
    ids, attn, scored = chat_batch(50, groups, loners=1)
    lengths = attn.sum(-1)
    units = shared_units(ids, attn, scored)
    p = Packing.build(attn, capacity=int(lengths.max()) + extra if extra else None, units=units)
    n = len(p.dest)
    assert len(set(p.dest.tolist())) == n == int(lengths.sum()) - p.shared <= p.bins * p.capacity
    real = attn.bool()
    held = p.index[real]  # the computed token each real token reads
    assert (held >= 0).all() and (p.index[~real] == -1).all()
    cols = real.nonzero()[:, 1]
    assert (p.cols[held] == cols).all() and (ids[p.rows[held], p.cols[held]] == ids[real]).all()
    visible = p.attention_bias(window, 1, torch.float32)[:, 0] == 0  # [bins, C, C]
    flat = visible.view(p.bins, p.capacity, p.capacity)
    for r in range(len(ids)):
        for t in range(int(lengths[r])):
            d = int(p.dest[p.index[r, t]])
            b, q = divmod(d, p.capacity)
            seen = set((b * p.capacity + flat[b, q].nonzero()[:, 0]).tolist())
            low = 0 if window is None else max(0, t - window + 1)
            assert seen == {int(p.dest[p.index[r, u]]) for u in range(low, t + 1)}, (r, t)


def _update_batch(ids, attn, scored) -> TrainBatch:
    gen = torch.Generator().manual_seed(3)
    adv = (torch.randn(len(ids), 1, generator=gen).sign()) * scored
    weights = scored.clone()
    weights[0, :] *= 2.0  # a tree node counted for two leaves
    weights[1, (scored[1] > 0).nonzero()[0, 0]] = 0.0  # an untrained (forced) first token
    return TrainBatch(input_ids=ids, attention_mask=attn, completion_mask=scored, loss_weights=weights,
                      behavior_logprobs=-2.5 * scored, advantages=adv, rewards=torch.zeros(len(ids)),
                      group_ids=torch.arange(len(ids)))


@pytest.mark.parametrize("case", [{"passes": 2}, {"beta": 0.1}, {}])
def test_the_update_is_the_same_with_shared_prompts(tiny, case):
    model, _ = tiny
    ids, attn, scored = chat_batch(model.config.vocab_size)
    batch = _update_batch(ids, attn, scored)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    objective = ObjectiveConfig(method="grpo", beta=case.get("beta", 0.0), kl_estimator="k3")
    runs = {}
    for share in (False, True):
        m = copy.deepcopy(model)
        spec = UpdateSpec(objective, passes=case.get("passes", 1), micro_batch_size=len(batch), max_grad_norm=1e9,
                          max_len=24, packed=True, share_prompts=share)
        metrics = policy_update(m, torch.optim.SGD(m.parameters(), lr=0.0), copy.deepcopy(batch), spec, ref)
        runs[share] = metrics, {n: p.grad.clone() for n, p in m.named_parameters()}
    (off, g_off), (on, g_on) = runs[False], runs[True]
    assert off["update/prompt_tokens_shared"] == 0 and on["update/prompt_tokens_shared"] == SHARED
    assert off.keys() == on.keys()
    for key in off:
        if key != "update/prompt_tokens_shared":
            assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-6), key
    scale = max(float(g.abs().max()) for g in g_off.values())
    assert scale > 0
    for n, g in g_off.items():
        torch.testing.assert_close(g_on[n], g, rtol=1e-3, atol=1e-4 * scale, msg=n)
