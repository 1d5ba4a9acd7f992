"""The packed training forward gives the HF module's own log-probs, entropies and gradients."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tinymodel import redraw
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.model.packed import Packing, PackedForward, pack, supports_packing


def _qwen2():
    """Qwen2-shaped: tied head, biased q/k/v, 4 query heads on 2 key/value heads."""
    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = redraw(Qwen2ForCausalLM(config), std=0.2)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    return model


def _llama_untied():
    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=90, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=3, tie_word_embeddings=False)
    return redraw(LlamaForCausalLM(config), std=0.2)


def _mistral_window():
    torch.manual_seed(3)
    config = MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=1, sliding_window=4, head_dim=8)
    return redraw(MistralForCausalLM(config), std=0.2)


def _batch(vocab: int, lengths: list[int], prompt: int = 3, seed: int = 0):
    """Right-padded ids [B, T], attention mask, and the completion columns (all but the prompt)."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), T), generator=gen)
    attn = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * attn
    completion = attn[:, 1:].clone()
    completion[:, : prompt - 1] = 0
    return ids, attn, completion


MODELS = {"llama": lambda: redraw(__import__("tinymodel").tiny_redrawn()[0]), "qwen2": _qwen2,
          "llama_untied": _llama_untied, "mistral_window": _mistral_window}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 5}])
@pytest.mark.parametrize("chunk", [None, 4])
def test_packed_equals_hf(name, sampling, chunk):
    model = MODELS[name]()
    assert supports_packing(model)
    ids, attn, scored = _batch(model.config.vocab_size, [11, 4, 9, 3, 7, 12])
    out, grads = {}, {}
    for path in ("hf", "packed"):
        m = copy.deepcopy(model)
        if path == "hf":
            lp, ent = token_logprobs_and_entropy(m, ids, attn, **sampling)
        else:
            lp, ent = PackedForward(m).logprobs(ids, attn, scored, chunk=chunk, **sampling)
        (lp * scored * torch.linspace(0.5, 2, lp.shape[1])).sum().backward()
        out[path] = (lp.detach() * scored, ent * scored)
        grads[path] = {n: p.grad.clone() for n, p in m.named_parameters()}
    torch.testing.assert_close(out["packed"][0], out["hf"][0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(out["packed"][1], out["hf"][1], rtol=1e-5, atol=2e-5)
    assert (out["hf"][0] != 0).sum() == scored.sum()  # every scored position has a real log-prob
    scale = max(float(g.abs().max()) for g in grads["hf"].values())
    for n, g in grads["hf"].items():
        torch.testing.assert_close(grads["packed"][n], g, rtol=1e-3, atol=1e-4 * scale, msg=n)
        assert g.abs().sum() > 0 or "bias" in n


def test_unscored_columns_are_zero_and_carry_no_gradient():
    model = _qwen2()
    ids, attn, scored = _batch(120, [8, 5])
    lp, ent = PackedForward(model).logprobs(ids, attn, scored)
    assert lp.shape == (2, 7) and (lp[scored == 0] == 0).all() and (lp[scored == 1] < 0).all()
    assert (ent[scored == 0] == 0).all() and (ent[scored == 1] > 0).all()


def test_packing_puts_short_rows_together():
    assert pack([5, 3, 2, 4], 6) == [[0], [3, 2], [1]]
    assert pack([], 4) == []
    with pytest.raises(ValueError, match="does not fit"):
        pack([7], 6)
    attn = (torch.arange(6)[None] < torch.tensor([[6], [2], [3], [1]])).long()
    p = Packing.build(attn)
    assert p.bins == 2 and p.capacity == 6  # [6] and [3, 2, 1]
    assert p.positions.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]]
    assert p.segments.tolist()[1] == [2, 2, 2, 1, 1, 3] and p.units.tolist()[1] == [2, 2, 2, 1, 1, 3]
    assert p.shared == 0 and p.index[1].tolist() == [9, 10, -1, -1, -1, -1]  # row 1 after rows 0 and 2 (6 + 3)


@given(st.lists(st.integers(1, 30), min_size=1, max_size=40), st.integers(0, 60))
def test_packing_places_every_token_once(lengths, extra):
    attn = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    p = Packing.build(attn, capacity=max(lengths) + extra)
    assert len(set(p.dest.tolist())) == sum(lengths) <= p.bins * p.capacity
    flat_seg, flat_pos = p.segments.view(-1), p.positions.view(-1)
    assert (flat_seg[p.dest] == p.rows).all() and (flat_pos[p.dest] == p.cols).all()
    assert (p.index[p.rows, p.cols] == torch.arange(len(p.dest))).all() and (p.index[attn == 0] == -1).all()
    bins = pack(lengths, p.capacity)
    assert all(sum(lengths[r] for r in b) <= p.capacity for b in bins)
    assert sorted(r for b in bins for r in b) == list(range(len(lengths)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_runs_below_float32_as_hf_does(dtype):
    """torch has no bfloat16 complex: below float32 RoPE runs in real arithmetic, rounded as HF rounds it."""
    model = _llama_untied().to(dtype)
    ids, attn, scored = _batch(model.config.vocab_size, [11, 4, 9, 3, 7, 12])
    with torch.no_grad():
        hf, _ = token_logprobs_and_entropy(model, ids, attn)
        packed, _ = PackedForward(model).logprobs(ids, attn, scored)
    assert packed.dtype == torch.float32 or packed.dtype == dtype
    # a low-precision forward summed in another order: agreement to the format's precision, not bits
    torch.testing.assert_close(packed.float() * scored, hf.float() * scored, rtol=0, atol=0.05)
    assert (packed.float() * scored != 0).sum() == scored.sum()
