"""Engine v2 branching API: ``SlotEngine.peek``, recorded top ``candidates`` and
``fork(..., replace_last=...)`` (LATR's "branch into an alternative at the latest position").

Fixtures follow ``test_engine_v2.py``: the tiny model's matrices are re-drawn at std .15 so
greedy decoding gives varied sequences that do end in EOS. Log-prob tolerances: the engine's
cached slot decode vs one plain forward differ only in summation order (~1e-6..1e-5).
"""

import pytest
import torch

from rollwise.engine.engine import Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.model.logprobs import token_logprobs_and_entropy

TEXTS = ["12+3=", "hello world\n", "The answer is 42.", "zz top"]
ATOL = 1e-4
MAX_NEW = 24


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [tok(t)["input_ids"] for t in TEXTS]


def engine_for(tiny, max_batch_size=8):
    model, tok = tiny
    return SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=max_batch_size)


def sampled_params(tok, **kw):
    kw.setdefault("max_new_tokens", MAX_NEW)
    return SamplingParams(stop_token_ids=(tok.eos_token_id,), top_candidates=3, **kw)


def greedy_params(tok, max_new=MAX_NEW):
    return SamplingParams(temperature=0, max_new_tokens=max_new, stop_token_ids=(tok.eos_token_id,))


def fresh_greedy(tiny, prompt_ids, max_new):
    """A fresh greedy run of ``prompt_ids`` (no fork involved)."""
    _, tok = tiny
    (out,) = engine_for(tiny).generate([Request(list(prompt_ids), greedy_params(tok, max_new))])
    return out


def next_token_logprobs(model, ids, temperature=1.0):
    """log_softmax(logits / T) at every position of one plain forward: row t predicts ids[t + 1]."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return (logits / temperature).log_softmax(-1)


def step_n(engine, n):
    done = []
    for _ in range(n):
        done += engine.step()
    return done


# -- peek ---------------------------------------------------------------------------------
def test_peek_shows_the_running_sequence_and_rejects_other_handles(tiny, prompts):
    _, tok = tiny
    engine = engine_for(tiny)
    (h,) = engine.submit([Request(prompts[1], sampled_params(tok, seed=5, max_new_tokens=12))])
    view = engine.peek(h)  # queued: nothing sampled yet
    assert view.token_ids == [] and view.logprobs == [] and view.versions == [] and view.candidates is None
    snapshots = []
    for _ in range(3):
        assert engine.step() == []
        v = engine.peek(h)
        snapshots.append((list(v.token_ids), list(v.logprobs), list(v.versions)))
    assert [len(s[0]) for s in snapshots] == [1, 2, 3]  # one token per step
    out = engine.run_until()[h]
    for tokens, logprobs, versions in snapshots:  # every snapshot is a prefix of the final completion
        n = len(tokens)
        assert tokens == out.token_ids[:n] and logprobs == out.logprobs[:n] and versions == [0] * n
    with pytest.raises(ValueError, match="not queued or running"):
        engine.peek(h)  # finished
    with pytest.raises(ValueError, match="not queued or running"):
        engine.peek(12345)  # unknown
    (h2,) = engine.submit([Request(prompts[0], sampled_params(tok, seed=1))])
    engine.step()
    engine.fork(h2, 2)
    with pytest.raises(ValueError, match="not queued or running"):
        engine.peek(h2)  # a forked parent is gone


# -- candidates ---------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_candidates_are_sorted_and_agree_with_the_sampled_logprob(tiny, prompts, temperature):
    model, tok = tiny
    engine = engine_for(tiny)
    (h,) = engine.submit([Request(prompts[2], sampled_params(tok, seed=7, temperature=temperature))])
    matched, seen, final = 0, [], None
    for _ in range(10):
        done = engine.step()
        if done:  # finished at this step: its last position's candidates are no longer visible
            final = done[0]
            break
        view = engine.peek(h)
        cands = list(view.candidates)
        seen.append(cands)
        ids, lps = [i for i, _ in cands], [lp for _, lp in cands]
        assert len(cands) == 3 and len(set(ids)) == 3
        assert lps == sorted(lps, reverse=True)  # best first
        sampled, sampled_lp = view.token_ids[-1], view.logprobs[-1]
        if sampled in ids:
            assert sampled_lp == pytest.approx(dict(cands)[sampled], abs=1e-5)
            matched += 1
        else:  # not among the top 3: it is less likely than all of them
            assert sampled_lp <= lps[-1] + 1e-6
    assert len(seen) >= 5
    if temperature == 0.5:
        assert matched > 0  # the comparison above really happened
    view = final or engine.peek(h)
    tokens, logprobs = list(view.token_ids), list(view.logprobs)
    # the candidates are the top 3 of log_softmax(logits / T) at the position, recomputed by a plain forward
    p = prompts[2]
    full = p + tokens
    ref = next_token_logprobs(model, full, temperature)
    for t, cands in enumerate(seen):
        values, idx = ref[len(p) - 1 + t].topk(3)
        assert [i for i, _ in cands] == idx.tolist(), t
        torch.testing.assert_close(torch.tensor([lp for _, lp in cands]), values, atol=ATOL, rtol=0)
    # and the sampled log-probs match the trainer's function at that temperature
    ids = torch.tensor([full])
    lp, _ = token_logprobs_and_entropy(model, ids, torch.ones_like(ids), temperature=temperature, with_entropy=False)
    torch.testing.assert_close(torch.tensor(logprobs), lp[0, len(p) - 1 :], atol=ATOL, rtol=0)


def test_no_candidates_without_top_candidates(tiny, prompts):
    engine = engine_for(tiny)
    (h,) = engine.submit([Request(prompts[0], SamplingParams(max_new_tokens=8, seed=1))])
    engine.step()
    assert engine.peek(h).candidates is None


# -- fork(replace_last=...) ---------------------------------------------------------------
K = 3  # tokens sampled by the parent before the fork


def start_parent(tiny, prompt, seed=3, max_batch_size=8, temperature=1.0):
    """A parent sampled with 3 candidates, stepped K times; returns (engine, handle, tokens, logprobs, candidates)."""
    _, tok = tiny
    engine = engine_for(tiny, max_batch_size)
    (h,) = engine.submit([Request(prompt, sampled_params(tok, seed=seed, temperature=temperature))])
    assert step_n(engine, K) == []
    v = engine.peek(h)
    assert tok.eos_token_id not in v.token_ids
    return engine, h, list(v.token_ids), list(v.logprobs), list(v.candidates)


def alternative(tokens, cands):
    alt = next(i for i, _ in cands if i != tokens[-1])
    return alt, dict(cands)[alt]


@pytest.mark.parametrize("forced_child", [1, 0])
def test_fork_replace_last_continues_from_the_alternative(tiny, prompts, forced_child):
    _, tok = tiny
    p = prompts[1]
    engine, h, tokens, logprobs, cands = start_parent(tiny, p)
    alt, alt_lp = alternative(tokens, cands)
    replace = [None, None]
    replace[forced_child] = alt
    before = engine.stats.prefix_tokens_shared
    children = engine.fork(h, 2, params=[greedy_params(tok)] * 2, replace_last=replace)
    plain_child = children[1 - forced_child]
    forced = children[forced_child]
    # right after the fork: the plain child is the parent, the forced one differs in its last token only
    pv, fv = engine.peek(plain_child), engine.peek(forced)
    assert pv.token_ids == tokens and pv.logprobs == logprobs
    assert fv.token_ids == tokens[:-1] + [alt]
    assert fv.logprobs[:-1] == logprobs[:-1] and fv.logprobs[-1] == pytest.approx(alt_lp, abs=1e-6)
    # the second child copies the cached prefix: prompt + K tokens but the last (never in the cache)
    assert engine.stats.prefix_tokens_shared - before == len(p) + K - 1
    outs = engine.run_until()
    assert sorted(outs) == sorted(children)  # the parent never completes
    assert outs[forced].forced == [K - 1] and outs[plain_child].forced == []
    assert outs[forced].token_ids[:K] == tokens[:-1] + [alt]
    assert outs[forced].logprobs[K - 1] == pytest.approx(alt_lp, abs=1e-6)
    assert outs[forced].logprobs[K:] == [0.0] * (len(outs[forced].token_ids) - K)  # greedy after the fork
    # each child continues exactly as a fresh greedy run of prompt + its tokens at the fork
    conts = {}
    for c, prefix in [(plain_child, tokens), (forced, tokens[:-1] + [alt])]:
        ref = fresh_greedy(tiny, p + prefix, MAX_NEW - K)
        assert outs[c].token_ids[:K] == prefix
        assert outs[c].token_ids[K:] == ref.token_ids, c
        assert outs[c].finish_reason == ref.finish_reason
        conts[c] = ref.token_ids
    assert conts[forced] != conts[plain_child]  # the test can tell the two starting tokens apart
    s = engine.stats
    assert s.prefill_tokens == len(p) and s.reprefill_tokens == 0  # nothing was computed twice


def test_fork_replace_last_without_a_free_slot_reprefills_the_alternative(tiny, prompts):
    # one slot: the forced child waits for its sibling to finish, then has no running sibling to copy
    # from (and different ids), so it is prefilled again: prompt + K tokens, alternative included
    _, tok = tiny
    p = prompts[1]
    engine, h, tokens, _, cands = start_parent(tiny, p, max_batch_size=1)
    alt, _ = alternative(tokens, cands)
    _keep, new = engine.fork(h, 2, params=[greedy_params(tok)] * 2, replace_last=[None, alt])
    outs = engine.run_until()
    ref = fresh_greedy(tiny, p + tokens[:-1] + [alt], MAX_NEW - K)
    assert outs[new].token_ids == tokens[:-1] + [alt] + ref.token_ids
    assert outs[new].forced == [K - 1]
    assert engine.stats.reprefill_tokens == len(p) + K
    assert engine.stats.prefix_tokens_shared == 0


def test_replace_last_with_the_sampled_token_is_not_forced(tiny, prompts):
    # the sampled token must be a candidate: try seeds at a low temperature until it is (deterministic)
    for seed in range(11, 40):
        engine, h, tokens, logprobs, cands = start_parent(tiny, prompts[1], seed=seed, temperature=0.5)
        if tokens[-1] in dict(cands):
            break
    else:
        pytest.fail("no seed sampled a top-3 token at the fork position")
    a, b = engine.fork(h, 2, replace_last=[None, tokens[-1]])
    assert engine.peek(b).token_ids == tokens and engine.peek(b).logprobs == logprobs
    outs = engine.run_until()
    assert outs[a].forced == [] and outs[b].forced == []


def test_forced_positions_survive_pause_resume_and_later_forks(tiny, prompts):
    _, tok = tiny
    p = prompts[3]
    engine, h, tokens, _, cands = start_parent(tiny, p, seed=4)
    alt, alt_lp = alternative(tokens, cands)
    _keep, new = engine.fork(h, 2, params=[sampled_params(tok, temperature=0)] * 2, replace_last=[None, alt])
    (state,) = engine.pause([new])  # paused before it ever decoded: resume must start from alt
    assert state.forced == [K - 1] and state.token_ids == tokens[:-1] + [alt]
    assert state.logprobs[-1] == pytest.approx(alt_lp, abs=1e-6)
    (resumed,) = engine.resume([state])
    assert step_n(engine, 2) == []
    # fork the resumed sequence again at its latest position, into another alternative
    v = engine.peek(resumed)
    tokens2 = list(v.token_ids)
    alt2, _ = alternative(tokens2, list(v.candidates))
    x, y = engine.fork(resumed, 2, replace_last=[None, alt2])
    outs = engine.run_until()
    pos2 = len(tokens2) - 1  # K + 2 - 1
    assert pos2 == K + 1
    assert outs[x].forced == [K - 1]
    assert outs[y].forced == [K - 1, pos2]
    assert outs[y].token_ids[: pos2 + 1] == tokens2[:-1] + [alt2]
    # the resumed branch still continues from alt: a fresh greedy run of prompt + tokens[:-1] + [alt]
    ref = fresh_greedy(tiny, p + tokens[:-1] + [alt], MAX_NEW - K)
    assert outs[x].token_ids == tokens[:-1] + [alt] + ref.token_ids
    assert engine.stats.reprefill_tokens == len(p) + K  # the resume re-prefilled prompt + K tokens


# -- errors -------------------------------------------------------------------------------
def test_replace_last_errors_leave_the_parent_untouched(tiny, prompts):
    _, tok = tiny
    engine, h, tokens, _, cands = start_parent(tiny, prompts[2], seed=9)
    not_a_candidate = next(i for i in range(len(tok)) if i not in dict(cands))
    with pytest.raises(ValueError, match="not among the parent's recorded candidates"):
        engine.fork(h, 2, replace_last=[None, not_a_candidate])
    with pytest.raises(ValueError, match="2 replace_last entries for 3 children"):
        engine.fork(h, 3, replace_last=[None, cands[0][0]])
    with pytest.raises(ValueError, match="replace_last entries"):
        engine.fork(h, 1, replace_last=[None, None])
    # nothing happened: the parent is still running with its tokens, and completes normally
    assert engine.peek(h).token_ids == tokens
    assert engine.stats.prefix_tokens_shared == 0
    outs = engine.run_until()
    assert list(outs) == [h] and outs[h].token_ids[:K] == tokens and outs[h].forced == []


def test_replace_last_needs_a_running_parent_with_candidates(tiny, prompts):
    _, tok = tiny
    engine = engine_for(tiny)
    (queued,) = engine.submit([Request(prompts[0], sampled_params(tok, seed=1))])
    with pytest.raises(ValueError, match="running parent"):
        engine.fork(queued, 2, replace_last=[None, 5])
    (plain,) = engine.submit([Request(prompts[1], SamplingParams(max_new_tokens=8, seed=2))])
    engine.step()
    tok_id = engine.peek(plain).token_ids[-1] ^ 1
    with pytest.raises(ValueError, match="top_candidates"):  # sampled without candidates
        engine.fork(plain, 2, replace_last=[None, tok_id])
    outs = engine.run_until()  # both still complete
    assert sorted(outs) == sorted([queued, plain])


def test_forcing_a_stop_token_finishes_the_child(tiny, prompts):
    _, tok = tiny
    eos = tok.eos_token_id
    engine = engine_for(tiny)
    params = SamplingParams(max_new_tokens=12, seed=1, top_candidates=len(tok), stop_token_ids=(eos,))
    (h,) = engine.submit([Request(prompts[1], params)])
    assert step_n(engine, K) == []
    view = engine.peek(h)
    assert eos in dict(view.candidates) and eos not in view.token_ids
    _keep, new = engine.fork(h, 2, replace_last=[None, eos])
    outs = engine.run_until()
    assert outs[new].token_ids == view.token_ids[:-1] + [eos]  # ends at the stop token it was given
    assert outs[new].finish_reason == "stop"
