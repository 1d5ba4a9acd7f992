"""Continuing a finished sequence with appended ids, keeping its cache (multi-turn episodes):
``SamplingParams(keep_cache=True)`` → ``Completion.kv``; ``state.continuation`` → ``SlotEngine.resume``.

The claim under test: reusing the cache changes nothing but the work done. A continuation
samples exactly as a fresh request seeded alike whose prompt is the whole conversation
(prompt + turn one + appended ids), and prefills only the last sampled id and the appended
ones. The tiny model runs in float64 here, so the cached and fresh paths (different summation
orders) agree to ~1e-15 in the logits; the sampler works in float32, so log-probs are compared
to 1e-6 and tokens exactly.
"""

import copy
from dataclasses import replace

import pytest
import torch
from tinymodel import redraw

from rollwise.engine.engine import Engine, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine
from rollwise.engine.state import PartialState, continuation
from rollwise.generate.group import forced_weights
from rollwise.model.tiny import build_tiny

ATOL = 1e-6
TURN_ONE = 7  # tokens sampled in the first turn (no stop token: every turn runs to its length)
TURN_TWO = 9


@pytest.fixture(scope="module")
def tiny64():
    model, tok = build_tiny("tiny", seed=0, dtype=torch.float64)
    return redraw(model), tok


def engine_for(tiny64, model=None, **kw):
    m, tok = tiny64
    return SlotEngine(model or m, pad_token_id=tok.pad_token_id, **kw)


def ids(tok, text):
    return tok(text)["input_ids"]


def first_turn(engine, prompt, seed=3, **kw):
    (h,) = engine.submit([Request(prompt, SamplingParams(max_new_tokens=TURN_ONE, seed=seed, keep_cache=True, **kw))])
    return engine.run_until()[h]


def continue_turn(engine, done, appended, seed=11, **kw):
    """Resume ``done`` with ``appended`` for TURN_TWO more sampled tokens; return its completion."""
    budget = len(done.token_ids) + len(appended) + TURN_TWO
    params = SamplingParams(max_new_tokens=budget, keep_cache=True, **kw)
    (h,) = engine.resume([continuation(done, appended, params=params, seed=seed, version=engine.version)])
    return engine.run_until()[h]


def fresh(engine, conversation, seed=11, **kw):
    (h,) = engine.submit([Request(conversation, SamplingParams(max_new_tokens=TURN_TWO, seed=seed, **kw))])
    return engine.run_until()[h]


def assert_continues_as(out, done, appended, ref):
    """``out`` holds ``done``'s tokens, then ``appended``, then exactly what ``ref`` sampled."""
    k = len(done.token_ids) + len(appended)
    assert out.token_ids[:k] == done.token_ids + list(appended)
    assert out.logprobs[: len(done.token_ids)] == done.logprobs
    assert out.token_ids[k:] == ref.token_ids
    torch.testing.assert_close(torch.tensor(out.logprobs[k:]), torch.tensor(ref.logprobs), atol=ATOL, rtol=0)


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}, {"temperature": 0}])
@pytest.mark.parametrize("tool", ["<tool>4</tool>\n", ""])
def test_continuation_samples_as_the_whole_conversation_fresh(tiny64, settings, tool):
    _, tok = tiny64
    prompt, appended = ids(tok, "12+3="), ids(tok, tool)[1:] if tool else []  # no BOS mid-conversation
    engine = engine_for(tiny64)
    done = first_turn(engine, prompt, **settings)
    assert done.kv is not None and done.kv_version == 0
    assert [t.shape[2] for t in done.kv] == [len(prompt) + TURN_ONE - 1] * len(done.kv)
    out = continue_turn(engine, done, appended, **settings)
    ref = fresh(engine_for(tiny64), prompt + done.token_ids + appended, **settings)
    assert_continues_as(out, done, appended, ref)
    assert out.finish_reason == "length" and out.versions == [0] * len(out.token_ids)


def test_continuation_prefills_only_the_appended_ids(tiny64):
    _, tok = tiny64
    prompt, appended = ids(tok, "The answer is"), ids(tok, " [result: 42]")[1:]
    engine = engine_for(tiny64)
    done = first_turn(engine, prompt)
    before = copy.copy(engine.stats)
    out = continue_turn(engine, done, appended)
    reused = len(prompt) + TURN_ONE - 1  # every id of turn one but the last sampled one, never fed
    assert engine.stats.restored_tokens - before.restored_tokens == reused
    assert engine.stats.prefill_tokens - before.prefill_tokens == len(appended) + 1  # + that last sampled id
    assert engine.stats.reprefill_tokens == before.reprefill_tokens
    assert engine.stats.forward_calls - before.forward_calls == TURN_TWO  # one prefill, then one decode per token
    assert len(out.token_ids) == TURN_ONE + len(appended) + TURN_TWO
    # the same continuation without the cache prefills the conversation
    uncached = continuation(replace(done, kv=None, kv_version=None), appended, params=SamplingParams(max_new_tokens=40),
                            seed=11, version=0)
    engine.resume([uncached])
    before = copy.copy(engine.stats)
    engine.run_until()
    assert engine.stats.prefill_tokens - before.prefill_tokens == reused + len(appended) + 1
    assert engine.stats.restored_tokens == before.restored_tokens


def test_three_turns_reuse_the_cache_each_time_and_mark_appended_ids_forced(tiny64):
    _, tok = tiny64
    prompt, tool_a, tool_b = ids(tok, "99*9="), ids(tok, "<r>891</r>")[1:], ids(tok, "<r>ok</r>\n")[1:]
    engine = engine_for(tiny64)
    done = first_turn(engine, prompt, seed=5)
    two = continue_turn(engine, done, tool_a, seed=6)
    before = copy.copy(engine.stats)
    three = continue_turn(engine, two, tool_b, seed=7)
    assert engine.stats.prefill_tokens - before.prefill_tokens == len(tool_b) + 1
    assert engine.stats.restored_tokens - before.restored_tokens == len(prompt) + len(two.token_ids) - 1
    ref = fresh(engine_for(tiny64), prompt + two.token_ids + tool_b, seed=7)
    assert_continues_as(three, two, tool_b, ref)
    at_a = list(range(TURN_ONE, TURN_ONE + len(tool_a)))
    at_b = list(range(len(two.token_ids), len(two.token_ids) + len(tool_b)))
    assert three.forced == at_a + at_b
    assert [three.logprobs[i] for i in three.forced] == [0.0] * len(three.forced)
    assert all(lp < 0 for i, lp in enumerate(three.logprobs) if i not in three.forced)  # sampled at temperature 1
    weights = forced_weights(len(three.token_ids), three.forced)
    assert [i for i, w in enumerate(weights) if w == 0] == at_a + at_b


def test_continuations_beside_running_and_fresh_rows(tiny64):
    """One step admits a fresh leader and continuations of different cached lengths (two sharing
    one) while another row decodes: each samples as it would alone."""
    _, tok = tiny64
    prompts = [ids(tok, t) for t in ("12+3=", "hello world\n", "abc", "12+3=")]
    tools = [ids(tok, t)[1:] for t in ("<t>15</t>", "<t>x</t>\n", "<t>no</t>", "<t>1</t>")]
    others = [Request(ids(tok, "zz top"), SamplingParams(max_new_tokens=30, seed=1)),
              Request(ids(tok, "q"), SamplingParams(max_new_tokens=5, seed=2))]
    engine = engine_for(tiny64, max_batch_size=8)
    dones = [first_turn(engine, p, seed=20 + i) for i, p in enumerate(prompts)]
    (runner,) = engine.submit(others[:1])
    engine.step(), engine.step()
    states = [continuation(d, t, params=SamplingParams(max_new_tokens=len(d.token_ids) + len(t) + TURN_TWO),
                           seed=30 + i, version=0) for i, (d, t) in enumerate(zip(dones, tools))]
    handles = engine.resume(states)
    (leader,) = engine.submit(others[1:])
    before = copy.copy(engine.stats)
    engine.step()
    assert len(engine._rows) == 6
    assert engine.stats.forward_calls - before.forward_calls == 1 + 1 + 3  # decode, the leader, one per cached length
    prefilled = len(others[1].prompt_ids) + sum(len(t) + 1 for t in tools)  # each continuation: its last id + tool
    assert engine.stats.prefill_tokens - before.prefill_tokens == prefilled
    outs = engine.run_until()
    alone = engine_for(tiny64)
    for i, (d, t, h) in enumerate(zip(dones, tools, handles)):
        assert_continues_as(outs[h], d, t, fresh(alone, prompts[i] + d.token_ids + t, seed=30 + i))
    refs = engine_for(tiny64).generate(others)
    assert [outs[runner].token_ids, outs[leader].token_ids] == [r.token_ids for r in refs]


def test_after_new_weights_the_stale_cache_is_recomputed(tiny64):
    model, tok = tiny64
    model = copy.deepcopy(model)
    new_weights = redraw(copy.deepcopy(model), seed=1).state_dict()
    prompt, appended = ids(tok, "12+3="), ids(tok, "<t>15</t>")[1:]
    engine = engine_for(tiny64, model=model)
    done = first_turn(engine, prompt)
    assert engine.load_weights(new_weights) == 1
    before = copy.copy(engine.stats)
    out = continue_turn(engine, done, appended)
    conversation = prompt + done.token_ids + appended
    assert engine.stats.restored_tokens == before.restored_tokens
    assert engine.stats.prefill_tokens - before.prefill_tokens == len(conversation)
    assert engine.stats.reprefill_tokens - before.reprefill_tokens == len(conversation)
    ref = fresh(engine_for(tiny64, model=copy.deepcopy(model)), conversation)
    assert_continues_as(out, done, appended, ref)
    assert out.versions == [0] * TURN_ONE + [1] * (len(appended) + TURN_TWO)
    assert out.kv_version == 1


def test_a_turn_across_a_weight_update_reports_its_oldest_cache(tiny64):
    """A turn that ran through ``load_weights`` holds keys/values of both policies: its ``kv_version``
    is the older one, so its continuation is prefilled whole under the new weights."""
    model, tok = tiny64
    model = copy.deepcopy(model)
    prompt, appended = ids(tok, "hello"), ids(tok, "<t>!</t>")[1:]
    engine = engine_for(tiny64, model=model)
    (h,) = engine.submit([Request(prompt, SamplingParams(max_new_tokens=TURN_ONE, seed=3, keep_cache=True))])
    engine.step(), engine.step()
    engine.load_weights(redraw(copy.deepcopy(model), seed=2).state_dict())
    done = engine.run_until()[h]
    assert done.versions == [0, 0] + [1] * (TURN_ONE - 2) and done.kv_version == 0
    before = copy.copy(engine.stats)
    out = continue_turn(engine, done, appended)
    assert engine.stats.restored_tokens == before.restored_tokens
    assert_continues_as(out, done, appended, fresh(engine_for(tiny64, model=model), prompt + done.token_ids + appended))


def test_without_keep_cache_no_cache_is_carried(tiny64):
    model, tok = tiny64
    prompt = ids(tok, "abc")
    (out,) = engine_for(tiny64).generate([Request(prompt, SamplingParams(max_new_tokens=4, seed=1))])
    assert out.kv is None and out.kv_version is None
    (v1,) = Engine(model, pad_token_id=tok.pad_token_id).generate([Request(prompt, SamplingParams(max_new_tokens=4))])
    assert v1.kv is None and v1.kv_version is None


def test_bad_continuations_are_clear_errors(tiny64):
    _, tok = tiny64
    prompt, appended = ids(tok, "12+3="), ids(tok, "<t>15</t>")[1:]
    engine = engine_for(tiny64, max_len=64)
    done = first_turn(engine, prompt)
    params = SamplingParams(max_new_tokens=40)
    good = continuation(done, appended, params=params, seed=1, version=0)

    def state(**changes):
        fields = {**good.__dict__, **changes}
        return PartialState(**fields)

    cached, short = len(prompt) + TURN_ONE - 1, len(prompt) + TURN_ONE - 2
    with pytest.raises(ValueError, match=f"cover {cached} positions but its ids .* have {short}:"):
        engine.resume([state(token_ids=done.token_ids[:-2], logprobs=done.logprobs[:-2], versions=done.versions[:-2],
                             forced=[])])  # a cache longer than the ids: made for other ids
    with pytest.raises(ValueError, match="not this model's"):
        engine.resume([state(kv=done.kv[:1])])
    with pytest.raises(ValueError, match="not this model's"):
        engine.resume([state(kv=[t[..., :1] for t in done.kv])])  # another head_dim
    n = TURN_ONE + len(appended)
    with pytest.raises(ValueError, match=f"holds {n} tokens .* max_new_tokens is {n}"):
        engine.resume([state(params=SamplingParams(max_new_tokens=n))])
    with pytest.raises(ValueError, match="exceeds the engine's max_len 64"):
        engine.resume([state(params=SamplingParams(max_new_tokens=60))])
    with pytest.raises(ValueError, match="forced positions"):
        engine.resume([state(forced=[len(good.token_ids)])])
    assert not engine._queue and not engine._live  # nothing was queued
    (h,) = engine.resume([good])
    assert len(engine.run_until()[h].token_ids) == 40
