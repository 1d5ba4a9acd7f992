"""The chunked LM-head path gives the whole-logits path's log-probs, entropies and gradients."""

import copy

import pytest
import torch

from rollwise.model.logprobs import logits_chunk, token_logprobs_and_entropy


def _batch(tok):
    ids = torch.tensor([[5, 9, 12, 30, 41, 7, 8, 22, 3], [5, 10, 11, 2, 0, 0, 0, 0, 0]])
    attn = (torch.arange(9)[None, :] < torch.tensor([[9], [4]])).long()
    return ids, attn


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.7, "top_k": 5}, {"top_p": 0.8}])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_equals_whole(tiny, sampling, chunk):
    model, tok = tiny
    ids, attn = _batch(tok)
    grads = {}
    outs = {}
    for name, c in (("whole", None), ("chunked", chunk)):
        m = copy.deepcopy(model)
        lp, ent = token_logprobs_and_entropy(m, ids, attn, chunk=c, **sampling)
        (lp * attn[:, 1:]).sum().backward()
        outs[name] = (lp.detach(), ent)
        grads[name] = [p.grad.clone() for p in m.parameters()]
    torch.testing.assert_close(outs["chunked"][0], outs["whole"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["chunked"][1], outs["whole"][1], rtol=1e-5, atol=1e-5)
    assert outs["whole"][0].shape == (2, 8) and torch.isfinite(outs["whole"][0]).all()
    scale = max(float(g.abs().max()) for g in grads["whole"])
    for a, b in zip(grads["whole"], grads["chunked"]):  # equal up to float summation order
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4 * scale)
    assert any(g.abs().sum() > 0 for g in grads["chunked"])


def test_chunk_size_from_the_budget(tiny):
    model, _ = tiny  # vocabulary 99: 8 rows × 99 × 12 bytes ≈ 9.3 KB per position
    assert logits_chunk(model, 8, 100, None) is None
    assert logits_chunk(model, 8, 100, 1.0) is None  # 1 MB holds 100 positions: the whole logits
    assert logits_chunk(model, 8, 1000, 1.0) == int(2**20 // (8 * 99 * 12))  # 110 positions a slice
    assert logits_chunk(model, 8, 1000, 1e-6) == 1  # never below one position
