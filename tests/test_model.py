"""Tiny preset: save → Auto* reload is exact; BOS handling; log-prob/entropy shapes."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollwise.model.logprobs import token_logprobs_and_entropy
from rollwise.model.tiny import build_tiny, save_tiny

# spaces and newlines are what a byte-level pre-tokenizer would silently drop (see tiny.py)
TEXTS = ["What is 12 + 30?\nAnswer: 42", "  two  spaces\n\nand blank lines  ", "x"]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("tiny", seed=0)


def test_round_trip(tiny, tmp_path):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert tok2(text)["input_ids"] == ids
        assert len(ids) == len(text) + 1  # one token per character, plus BOS
        for t in (tok, tok2):
            assert t.decode(t(text, add_special_tokens=False)["input_ids"]) == text
            assert t.decode(t(text)["input_ids"], skip_special_tokens=True) == text
    assert (tok2.pad_token_id, tok2.bos_token_id, tok2.eos_token_id) == (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    enc = tok(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        torch.testing.assert_close(model2(**enc).logits, model(**enc).logits, atol=0, rtol=0)


def test_save_tiny_matches_build(tmp_path):
    path = save_tiny(tmp_path / "tiny", "tiny", seed=0)
    model, _ = build_tiny("tiny", seed=0)
    reloaded = AutoModelForCausalLM.from_pretrained(path)
    for (name, a), (_, b) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_build_is_seeded(tiny):
    model, _ = tiny
    same, _ = build_tiny("tiny", seed=0)
    other, _ = build_tiny("tiny", seed=1)
    w = model.model.embed_tokens.weight
    assert torch.equal(w, same.model.embed_tokens.weight)
    assert not torch.equal(w, other.model.embed_tokens.weight)
    with pytest.raises(ValueError, match="unknown tiny preset"):
        build_tiny("huge")


def test_bos(tiny):
    _, tok = tiny
    with_bos = tok("ab")["input_ids"]
    without = tok("ab", add_special_tokens=False)["input_ids"]
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == without
    assert tok.bos_token_id not in without and len(without) == 2


def test_logprobs_and_entropy_shapes(tiny):
    model, tok = tiny
    tok_right = [tok(t)["input_ids"] for t in TEXTS]
    width = max(map(len, tok_right))
    ids = torch.full((len(TEXTS), width), tok.pad_token_id)
    mask = torch.zeros((len(TEXTS), width), dtype=torch.long)
    for i, s in enumerate(tok_right):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    logprobs, entropy = token_logprobs_and_entropy(model, ids, mask)
    assert logprobs.shape == entropy.shape == (len(TEXTS), width - 1)
    assert (logprobs <= 0).all()
    with torch.no_grad():  # entropy of one position by hand: −Σ p log p of the softmax
        p = model(input_ids=ids[:1, :3]).logits[0, 1].log_softmax(-1)
    torch.testing.assert_close(entropy[0, 1], -(p.exp() * p).sum(), atol=1e-5, rtol=0)
    assert (entropy <= torch.log(torch.tensor(float(len(tok)))) + 1e-4).all()  # at most log |V|
    assert logprobs.requires_grad and not entropy.requires_grad  # gradient flows through log-probs only
    # column t scores token t+1: check one entry against a direct softmax
    with torch.no_grad():
        logits = model(input_ids=ids[:1, :3]).logits[0, 1]
    torch.testing.assert_close(logprobs[0, 1], logits.log_softmax(-1)[ids[0, 2]], atol=1e-5, rtol=0)
    lp_only, none = token_logprobs_and_entropy(model, ids, mask, temperature=0.7, with_entropy=False)
    assert none is None and lp_only.shape == logprobs.shape
