"""The embedded engine against Hugging Face ``generate`` and the trainer's log-prob function.

The model is the ``tiny`` preset with its matrices re-drawn at std .15: the fresh init
(std .02) gives near-uniform logits, so greedy decoding repeats one token forever and EOS
never comes. Larger weights give varied sequences that do end in EOS, so the comparisons
below exercise more than one token and the stop path (the ``tiny`` fixture: tests/conftest.py).
"""

import pytest
import torch

from rollwise.engine.engine import Engine, Request
from rollwise.engine.sampling import SamplingParams, filtered_logprobs, sample_next
from rollwise.model.logprobs import token_logprobs_and_entropy

TEXTS = ["12+3=", "hello world\n", "a", "The answer is 42."]


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [tok(t)["input_ids"] for t in TEXTS]


def engine_for(tiny, **kw):
    model, tok = tiny
    return Engine(model, pad_token_id=tok.pad_token_id, **kw)


def until_eos(ids, eos):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def test_greedy_matches_hf_generate(tiny, prompts):
    model, tok = tiny
    eos, max_new = tok.eos_token_id, 24
    params = SamplingParams(temperature=0, max_new_tokens=max_new, stop_token_ids=(eos,))
    outs = engine_for(tiny).generate([Request(p, params) for p in prompts])

    enc = tok(TEXTS, return_tensors="pt", padding=True)  # the tokenizer pads on the left
    assert enc["attention_mask"][:, 0].tolist() != [1] * len(TEXTS)  # prompts do differ in length
    with torch.no_grad():
        hf = model.generate(
            **enc, do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id
        )
    hf_new = hf[:, enc["input_ids"].shape[1] :].tolist()
    for out, ref in zip(outs, hf_new):
        assert out.token_ids == until_eos(ref, eos)
        assert out.logprobs == [0.0] * len(out.token_ids)  # greedy: the argmax has probability 1
    # at least one row met EOS and one ran to the limit, so both paths were compared
    assert {o.finish_reason for o in outs} == {"stop", "length"}


def test_sampling_logprobs_match_recomputed(tiny, prompts):
    model, tok = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=123)
    outs = engine_for(tiny).generate([Request(p, params) for p in prompts])
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):  # right-padded, as the trainer builds them
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(model, ids, mask)
    for i, o in enumerate(outs):
        p = len(o.prompt_ids)
        recomputed = logprobs[i, p - 1 : p - 1 + len(o.token_ids)]
        # fp32 on CPU: KV-cached, left-padded decoding vs one right-padded forward differ by
        # summation order only (~1e-6 here); 1e-4 leaves room for other BLAS kernels
        torch.testing.assert_close(torch.tensor(o.logprobs), recomputed, atol=1e-4, rtol=0)


def test_seeds(tiny, prompts):
    def run(seed, batch=prompts):
        params = SamplingParams(max_new_tokens=16, seed=seed)
        return [o.token_ids for o in engine_for(tiny).generate([Request(p, params) for p in batch])]

    assert run(7) == run(7)
    assert run(7) != run(8)
    # a request's own generator makes it independent of its batch-mates
    assert run(7, prompts[:1])[0] == run(7)[0]


def test_engine_seed_without_request_seed(tiny, prompts):
    def run(engine_seed):
        params = SamplingParams(max_new_tokens=16)
        return [o.token_ids for o in engine_for(tiny, seed=engine_seed).generate([Request(p, params) for p in prompts])]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_top_k_1_is_greedy(tiny, prompts):
    greedy = engine_for(tiny).generate([Request(p, SamplingParams(temperature=0, max_new_tokens=12)) for p in prompts])
    top1 = engine_for(tiny).generate(
        [Request(p, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=12, seed=i)) for i, p in enumerate(prompts)]
    )
    for g, t in zip(greedy, top1):
        assert t.token_ids == g.token_ids
        assert t.logprobs == pytest.approx([0.0] * len(t.token_ids), abs=1e-6)  # one token left, p = 1


def test_filtered_logprobs_top_p_and_top_k():
    # one distribution, shuffled so the sort/scatter is exercised: p = [.15, .5, .05, .3]
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log().expand(5, 4).clone()
    temperature = torch.ones(5)
    top_k = torch.tensor([0, 0, 0, 2, 3])
    top_p = torch.tensor([0.45, 0.75, 0.85, 1.0, 1.0])
    out = filtered_logprobs(logits, temperature, top_k, top_p).exp()
    expected = torch.tensor(
        [
            # top_p .45: .5 alone already covers .45 → {.5}
            [0, 1, 0, 0],
            # top_p .75: .5 < .75, .5 + .3 = .8 ≥ .75 → {.5, .3}, renormalised by .8
            [0, 0.5 / 0.8, 0, 0.3 / 0.8],
            # top_p .85: .8 < .85, + .15 = .95 ≥ .85 → {.5, .3, .15}; .05 dropped
            [0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95],
            # top_k 2 → {.5, .3}
            [0, 0.5 / 0.8, 0, 0.3 / 0.8],
            # top_k 3 → {.5, .3, .15}
            [0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95],
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    # temperature .5 squares the probabilities before renormalising: p² / Σp²
    sq = filtered_logprobs(probs.log()[None], torch.tensor([0.5]), torch.tensor([0]), torch.tensor([1.0])).exp()
    torch.testing.assert_close(sq[0], probs**2 / (probs**2).sum(), atol=1e-6, rtol=0)


def test_sample_next_frequencies():
    # 4000 rows of p = [.5, .3, .2], each with its own generator: frequencies within ±.03
    # (3.9 standard errors at p = .5), and each reported log-prob is log p of the drawn token
    probs = torch.tensor([0.5, 0.3, 0.2])
    n = 4000
    logits = probs.log().expand(n, 3)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    for params in (SamplingParams(), SamplingParams(top_p=0.99)):  # fast path and filtered path
        tokens, logprobs = sample_next(logits, [params] * n, gens)
        freq = torch.bincount(tokens, minlength=3).float() / n
        torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
        torch.testing.assert_close(logprobs, probs.log()[tokens], atol=1e-6, rtol=0)


def test_stop_and_length(tiny, prompts):
    first = engine_for(tiny).generate([Request(prompts[0], SamplingParams(temperature=0, max_new_tokens=1))])[0]
    tok0 = first.token_ids[0]
    stopped, capped = engine_for(tiny).generate(
        [
            Request(prompts[0], SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=(tok0,))),
            Request(prompts[1], SamplingParams(temperature=0, max_new_tokens=3)),
        ]
    )
    assert stopped.token_ids == [tok0] and stopped.finish_reason == "stop"  # the stop token is kept
    assert len(capped.token_ids) == 3 and capped.finish_reason == "length"
    with pytest.raises(ValueError, match="empty prompt"):
        engine_for(tiny).submit([Request([])])


def test_versions(tiny, prompts):
    model, _ = tiny
    engine = engine_for(tiny)
    params = SamplingParams(temperature=0, max_new_tokens=5)
    out = engine.generate([Request(prompts[0], params)])[0]
    assert out.versions == [0] * 5
    assert engine.load_weights(model.state_dict()) == 1  # a state dict
    assert engine.load_weights(model) == 2  # the shared model itself
    out = engine.generate([Request(prompts[0], params)])[0]
    assert out.versions == [2] * 5
    # new weights arriving mid-generation: each token keeps the version that sampled it
    engine.submit([Request(prompts[0], params)])
    engine.step()  # prefill + token 0
    engine.step()  # token 1
    engine.load_weights(model)
    out = engine.run_until()
    (out,) = out.values()
    assert out.versions == [2, 2, 3, 3, 3]


def test_stats(tiny, prompts):
    engine = engine_for(tiny)
    outs = engine.generate([Request(p, SamplingParams(temperature=0, max_new_tokens=6)) for p in prompts])
    stats = engine.stats
    assert stats.prefill_tokens == sum(len(p) for p in prompts)  # left padding excluded
    assert stats.decode_tokens == sum(len(o.token_ids) for o in outs)
    assert stats.forward_calls == 6  # one prefill, then one decode per further token
    assert stats.padded_decode_slots == 6 * len(prompts)
    assert stats.occupancy == 1.0  # every decoded row sampled a token (padding is not a decoded slot)
