"""Engine v2 (``SlotEngine``) against Hugging Face ``generate``, the trainer's log-prob
function, itself run request by request, and the v1 engine.

As in ``test_engine.py``, the tiny model's matrices are re-drawn at std .15 so greedy
decoding gives varied sequences that do end in EOS.

Float tolerance: a request's tokens never depend on its batch-mates, but its log-probs
may differ in the last bits — the batch shape (rows decoding together, prefill width)
changes how BLAS blocks the matmuls and so the summation order. Measured differences are
~1e-6..1e-5 (logits here are O(10)); tests allow 1e-4, as ``test_engine.py`` does.
"""

import copy
import random

import pytest
import torch
from tinymodel import redraw
from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rollwise.engine.engine import Engine, Request
from rollwise.engine.llama import UnsupportedModelError
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.slots import SlotEngine, child_seed
from rollwise.model.logprobs import token_logprobs_and_entropy

TEXTS = ["12+3=", "hello world\n", "a", "The answer is 42.", "xyz", "99*9=", "zz top", "q"]
ATOL = 1e-4


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [tok(t)["input_ids"] for t in TEXTS]


def engine_for(tiny, **kw):
    model, tok = tiny
    return SlotEngine(model, pad_token_id=tok.pad_token_id, **kw)


class Recording(SlotEngine):
    """Keeps the logits every row sampled from, by handle (a test hook, not engine API)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: dict[int, list[torch.Tensor]] = {}

    def _sample(self, logits):
        for seq, row in zip(self._rows, logits):
            self.seen.setdefault(seq.handle, []).append(row.clone())
        return super()._sample(logits)


def recorder(tiny, **kw):
    model, tok = tiny
    return Recording(model, pad_token_id=tok.pad_token_id, **kw)


def until_eos(ids, eos):
    return ids[: ids.index(eos) + 1] if eos in ids else ids


def recomputed_logprobs(model, outs, pad_id, temperature=1.0):
    """The trainer's log-probs of each completion's tokens (one right-padded forward)."""
    seqs = [o.prompt_ids + o.token_ids for o in outs]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(model, ids, mask, temperature=temperature, with_entropy=False)
    return [logprobs[i, len(o.prompt_ids) - 1 : len(o.prompt_ids) - 1 + len(o.token_ids)] for i, o in enumerate(outs)]


def hf_greedy(model, tok, texts, max_new):
    enc = tok(texts, return_tensors="pt", padding=True)  # the tokenizer pads on the left
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    return [until_eos(row, tok.eos_token_id) for row in out[:, enc["input_ids"].shape[1] :].tolist()]


# -- continuous batching ------------------------------------------------------------------
@pytest.mark.parametrize("slots", [64, 3])
def test_greedy_matches_hf_generate(tiny, prompts, slots):
    model, tok = tiny
    eos, max_new = tok.eos_token_id, 24
    params = SamplingParams(temperature=0, max_new_tokens=max_new, stop_token_ids=(eos,))
    outs = engine_for(tiny, max_batch_size=slots).generate([Request(p, params) for p in prompts])
    assert len(set(map(len, prompts))) > 3  # prompts do differ in length
    for out, ref in zip(outs, hf_greedy(model, tok, TEXTS, max_new)):
        assert out.token_ids == ref
        assert out.logprobs == [0.0] * len(out.token_ids)  # greedy: the argmax has probability 1
    assert {o.finish_reason for o in outs} == {"stop", "length"}  # both paths compared


def mixed_requests(prompts, eos=None):
    """Per-request temperature / top-k / top-p / max length / seed."""
    stop = () if eos is None else (eos,)
    return [
        Request(p, SamplingParams(temperature=[1.0, 0.7, 0.0][i % 3], top_k=[0, 0, 0, 5][i % 4],
                                  top_p=[1.0, 0.9][i % 2], max_new_tokens=[3, 30, 9, 17][i % 4], seed=i,
                                  stop_token_ids=stop))
        for i, p in enumerate(prompts)
    ]


def test_sampling_logprobs_match_recomputed(tiny, prompts):
    model, tok = tiny
    plain = [Request(p, SamplingParams(temperature=t, max_new_tokens=16, seed=i))
             for i, (p, t) in enumerate(zip(prompts, [1.0, 0.7] * 4))]
    outs = engine_for(tiny, max_batch_size=3).generate(plain)
    for temperature in (1.0, 0.7):
        chosen = [o for o, r in zip(outs, plain) if r.params.temperature == temperature]
        for o, ref in zip(chosen, recomputed_logprobs(model, chosen, tok.pad_token_id, temperature)):
            # the cached slot decode vs one right-padded forward: summation order only
            torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=ATOL, rtol=0)


def test_continuous_batching_matches_each_request_alone(tiny, prompts):
    _, tok = tiny
    reqs = mixed_requests(prompts, tok.eos_token_id)
    engine = engine_for(tiny, max_batch_size=3)  # fewer slots than requests: they queue
    batched = engine.generate(reqs)
    assert len(batched) == len(reqs) and engine.stats.slot_occupancy > 0.5
    for req, out in zip(reqs, batched):
        alone = engine_for(tiny).generate([req])[0]
        assert out.token_ids == alone.token_ids and out.finish_reason == alone.finish_reason
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=ATOL, rtol=0)
    assert [len(o.token_ids) for o in batched] != [r.params.max_new_tokens for r in reqs]  # some met EOS


def test_same_tokens_as_v1_engine(tiny, prompts):
    model, tok = tiny
    for reqs in (mixed_requests(prompts), [Request(p, SamplingParams(max_new_tokens=12)) for p in prompts]):
        v1 = Engine(model, pad_token_id=tok.pad_token_id, seed=5).generate(reqs)
        v2 = engine_for(tiny, max_batch_size=4, seed=5).generate(reqs)  # unseeded requests: the engine's draws
        assert [o.token_ids for o in v2] == [o.token_ids for o in v1]


def test_stats(tiny, prompts):
    engine = engine_for(tiny, max_batch_size=16)
    reqs = [Request(p, SamplingParams(temperature=0, max_new_tokens=2 + i)) for i, p in enumerate(prompts)]
    outs = engine.generate(reqs)
    s = engine.stats
    assert s.prefill_tokens == sum(len(p) for p in prompts)
    assert s.decode_tokens == s.padded_decode_slots == sum(len(o.token_ids) for o in outs) == sum(range(2, 10))
    assert s.occupancy == 1.0  # a finished row is never computed again
    longest = 2 + len(prompts) - 1
    # the first step prefills every prompt, in chunks of similar length (a new chunk below half
    # the longest of the current one), then one decode per step
    lens, chunks, first = sorted(map(len, prompts), reverse=True), 1, 0
    for i in range(1, len(lens)):
        if 2 * lens[i] < lens[first]:
            chunks, first = chunks + 1, i
    assert chunks > 1  # TEXTS mix long and short prompts
    assert s.steps == longest and s.forward_calls == longest + chunks - 1
    assert s.slot_occupancy == pytest.approx(s.decode_tokens / (longest * 16))
    assert s.prefix_tokens_shared == s.reprefill_tokens == 0
    # two slots for eight requests: admissions happen in later steps, each a prefill forward
    engine = engine_for(tiny, max_batch_size=2)
    engine.generate(reqs)
    assert engine.stats.prefill_tokens == sum(len(p) for p in prompts)
    assert engine.stats.decode_tokens == sum(len(o.token_ids) for o in outs)


def test_stop_length_versions_and_errors(tiny, prompts):
    model, _ = tiny
    engine = engine_for(tiny)
    params = SamplingParams(temperature=0, max_new_tokens=5)
    engine.submit([Request(prompts[0], params)])
    engine.step()
    engine.step()
    assert engine.load_weights(model) == 1
    (out,) = engine.run_until().values()
    assert out.versions == [0, 0, 1, 1, 1] and out.finish_reason == "length"
    tok0 = out.token_ids[0]
    stopped = engine.generate([Request(prompts[0], SamplingParams(temperature=0, max_new_tokens=9,
                                                                  stop_token_ids=(tok0,)))])[0]
    assert stopped.token_ids == [tok0] and stopped.finish_reason == "stop"
    with pytest.raises(ValueError, match="empty prompt"):
        engine.submit([Request([])])
    with pytest.raises(ValueError, match="max_len"):
        engine.submit([Request(prompts[0], SamplingParams(max_new_tokens=10_000))])
    with pytest.raises(ValueError, match="not queued or running"):
        engine.fork(12345, 2)


# -- other Llama-family architectures -----------------------------------------------------
def small_config(cls, **kw):
    return cls(vocab_size=99, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               **kw)


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_other_architectures_greedy_match_hf(tiny, arch):
    _, tok = tiny
    if arch == "qwen2":  # biased q/k/v; sliding window on the upper layer only
        config = small_config(Qwen2Config, use_sliding_window=True, sliding_window=6, max_window_layers=1)
        model = Qwen2ForCausalLM(config)
    else:  # sliding window shorter than the sequences
        model = MistralForCausalLM(small_config(MistralConfig, sliding_window=6))
    torch.manual_seed(0)
    model = redraw(model)
    if arch == "qwen2":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_(0, 0.5)
                layer.self_attn.k_proj.bias.normal_(0, 0.5)
    pair = (model, tok)
    texts = TEXTS[:4]
    params = SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=(tok.eos_token_id,))
    outs = engine_for(pair, max_batch_size=3).generate([Request(tok(t)["input_ids"], params) for t in texts])
    assert [o.token_ids for o in outs] == hf_greedy(model, tok, texts, 20)


def test_unsupported_architecture_is_a_clear_error():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(UnsupportedModelError, match="gpt2.*v1"):
        SlotEngine(model, pad_token_id=0)


# -- fork ---------------------------------------------------------------------------------
def test_fork_running_greedy_children_equal_the_unforked_run(tiny, prompts):
    params = SamplingParams(temperature=0, max_new_tokens=20)
    (ref,) = engine_for(tiny).generate([Request(prompts[3], params)])
    engine = engine_for(tiny)
    (h,) = engine.submit([Request(prompts[3], params)])
    for _ in range(4):
        engine.step()
    children = engine.fork(h, 3)
    outs = engine.run_until()
    assert sorted(outs) == sorted(children)  # the parent itself never completes
    for c in children:
        assert outs[c].token_ids == ref.token_ids and outs[c].logprobs == ref.logprobs
        assert outs[c].prompt_ids == ref.prompt_ids
    s = engine.stats
    shared = len(prompts[3]) + 4 - 1  # cached positions at the fork: prompt + 4 tokens but the last
    assert s.prefill_tokens == len(prompts[3])  # the prefix was never prefilled again
    assert s.prefix_tokens_shared == 2 * shared and s.reprefill_tokens == 0


def test_fork_child_first_distribution_equals_parents(tiny, prompts):
    model, tok = tiny
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
    parent = recorder(tiny)
    (h,) = parent.submit([Request(prompts[1], params)])
    for _ in range(5):
        parent.step()
    parent.step()  # the distribution the parent samples from right after step 5
    at_fork = parent.seen[h][5]

    engine = recorder(tiny)
    (h,) = engine.submit([Request(prompts[1], params)])
    for _ in range(5):
        engine.step()
    children = engine.fork(h, 8)
    outs = engine.run_until()
    for c in children:
        torch.testing.assert_close(engine.seen[c][0], at_fork, atol=ATOL, rtol=0)
    firsts = [outs[c].token_ids[5] for c in children]
    assert len(set(firsts)) > 1  # independent draws from the same distribution
    assert len({tuple(outs[c].token_ids) for c in children}) == len(children)
    # each child's generator is seeded from the parent's seed and its index: a rerun is identical
    again = engine_for(tiny)
    (h,) = again.submit([Request(prompts[1], params)])
    for _ in range(5):
        again.step()
    again.fork(h, 8)
    rerun = again.run_until()
    assert sorted(tuple(o.token_ids) for o in rerun.values()) == sorted(tuple(o.token_ids) for o in outs.values())
    # every child's tokens (shared prefix included) carry the recomputed log-probs
    for o, ref in zip([outs[c] for c in children],
                      recomputed_logprobs(model, [outs[c] for c in children], tok.pad_token_id)):
        torch.testing.assert_close(torch.tensor(o.logprobs), ref, atol=ATOL, rtol=0)


def test_fork_queued_prefills_the_prompt_once(tiny, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    engine = recorder(tiny)
    (h,) = engine.submit([Request(prompts[3], params)])
    children = engine.fork(h, 6)  # before any step: one prompt -> six samples
    outs = engine.run_until()
    p = len(prompts[3])
    assert engine.stats.prefill_tokens == p and engine.stats.prefix_tokens_shared == 5 * p
    first = [engine.seen[c][0] for c in children]
    assert all(torch.equal(f, first[0]) for f in first)  # literally the leader's logits
    assert len({tuple(outs[c].token_ids) for c in children}) == 6
    # a child equals a plain request with the child's seed
    alone = engine_for(tiny).generate([Request(prompts[3], SamplingParams(max_new_tokens=10,
                                                                          seed=child_seed(11, 2)))])[0]
    assert outs[children[2]].token_ids == alone.token_ids


def test_fork_overflow_copies_from_a_running_sibling(tiny, prompts):
    params = SamplingParams(temperature=0, max_new_tokens=12)
    (ref,) = engine_for(tiny).generate([Request(prompts[3], params)])
    engine = engine_for(tiny, max_batch_size=3)
    h, _ = engine.submit([Request(prompts[3], params), Request(prompts[0], SamplingParams(max_new_tokens=3))])
    engine.step()
    children = engine.fork(h, 3)  # one slot free: the third child waits until the short request ends
    assert list(engine._queue) == [engine._live[children[2]]]
    outs = engine.run_until()
    for c in children:
        assert outs[c].token_ids == ref.token_ids
    shared = len(prompts[3])  # forked after one token: prompt positions are cached
    assert engine.stats.prefix_tokens_shared == 2 * shared
    assert engine.stats.prefill_tokens == len(prompts[3]) + len(prompts[0])


# -- pause / resume -----------------------------------------------------------------------
def test_pause_resume_continues_as_if_never_paused(tiny, prompts):
    reqs = mixed_requests(prompts)
    straight = engine_for(tiny, max_batch_size=4).generate(reqs)

    engine = engine_for(tiny, max_batch_size=4)
    handles = engine.submit(reqs)
    done = {}
    for _ in range(5):
        done.update((c.handle, c) for c in engine.step())
    live = [h for h in handles if h not in done]  # running, or still queued
    assert 0 < len(done) and len(live) > 4  # some finished, some were queued, some running
    states = engine.pause(live)
    assert engine._rows == [] and not engine._queue
    assert all(len(s.token_ids) == len(s.logprobs) == len(s.versions) for s in states)
    assert any(s.token_ids for s in states) and any(not s.token_ids for s in states)  # running and queued
    computed = sum(len(s.prompt_ids) + len(s.token_ids) for s in states)
    resumed = engine.resume(states)
    done.update(engine.run_until())
    assert engine.stats.reprefill_tokens == computed
    by_request = dict(zip(live, resumed))
    for h, ref in zip(handles, straight):
        out = done[by_request.get(h, h)]
        assert out.token_ids == ref.token_ids and out.finish_reason == ref.finish_reason
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=ATOL, rtol=0)
        assert len(out.versions) == len(out.token_ids)


def test_resume_under_new_weights(tiny, prompts):
    model, tok = tiny
    model = copy.deepcopy(model)
    params = SamplingParams(temperature=1.0, max_new_tokens=14, seed=4)
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id)
    (h,) = engine.submit([Request(prompts[1], params)])
    for _ in range(6):
        engine.step()
    (state,) = engine.pause([h])
    old_model = copy.deepcopy(model)
    assert engine.load_weights(redraw(copy.deepcopy(model), seed=1).state_dict()) == 1
    (h2,) = engine.resume([state])
    out = engine.run_until()[h2]
    assert out.versions == [0] * 6 + [1] * 8
    assert out.token_ids[:6] == state.token_ids and out.logprobs[:6] == state.logprobs
    (old_ref,) = recomputed_logprobs(old_model, [out], tok.pad_token_id)
    (new_ref,) = recomputed_logprobs(model, [out], tok.pad_token_id)
    torch.testing.assert_close(torch.tensor(out.logprobs[:6]), old_ref[:6], atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.tensor(out.logprobs[6:]), new_ref[6:], atol=ATOL, rtol=0)
    assert not torch.allclose(old_ref[6:], new_ref[6:], atol=1e-2)  # the weights really changed


def test_fork_with_per_child_settings(tiny, prompts):
    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    (ref,) = engine_for(tiny).generate([Request(prompts[2], greedy)])
    engine = engine_for(tiny)
    (h,) = engine.submit([Request(prompts[2], SamplingParams(temperature=0, max_new_tokens=30))])
    engine.step()
    engine.step()
    budgets = [SamplingParams(temperature=0, max_new_tokens=m) for m in (16, 5, 9)]
    children = engine.fork(h, 3, budgets)
    outs = engine.run_until()
    for c, m in zip(children, (16, 5, 9)):
        assert outs[c].token_ids == ref.token_ids[:m] and outs[c].finish_reason == "length"
    with pytest.raises(ValueError, match="exceed"):
        (h,) = engine.submit([Request(prompts[2], greedy)])
        engine.step()
        engine.step()
        engine.fork(h, 1, [SamplingParams(max_new_tokens=2)])
    with pytest.raises(ValueError, match="2 sampling settings for 3"):
        engine.fork(h, 3, budgets[:2])


def test_pause_queued_and_bad_handles(tiny, prompts):
    params = SamplingParams(max_new_tokens=8, seed=2)
    (ref,) = engine_for(tiny).generate([Request(prompts[0], params)])
    engine = engine_for(tiny, max_batch_size=1)
    a, b = engine.submit([Request(prompts[1], params), Request(prompts[0], params)])
    engine.step()  # a runs, b waits
    with pytest.raises(ValueError, match="not queued or running"):
        engine.pause([b, 999])
    with pytest.raises(ValueError, match="twice"):
        engine.pause([b, b])
    (state,) = engine.pause([b])  # never admitted: nothing computed yet
    assert state.token_ids == [] and len(engine._queue) == 0
    (b2,) = engine.resume([state])
    outs = engine.run_until()
    assert sorted(outs) == [a, b2] and outs[b2].token_ids == ref.token_ids


@pytest.mark.parametrize("trial", range(4))
def test_random_interleavings_keep_every_sequence_exact(tiny, prompts, trial):
    """Greedy requests under random forks, pauses, resumes, new submissions and weight loads,
    with 1-5 slots: every completion is its prompt's greedy continuation, cut at its own
    max_new_tokens, whatever happened to it on the way (compaction, copies, re-prefills)."""
    rng = random.Random(trial)
    full = [o.token_ids for o in engine_for(tiny).generate(
        [Request(p, SamplingParams(temperature=0, max_new_tokens=45)) for p in prompts])]
    engine = engine_for(tiny, max_batch_size=rng.randint(1, 5))
    origin, paused, done = {}, [], {}  # handle -> (prompt index, max_new_tokens)

    def add(n):
        for _ in range(n):
            i, m = rng.randrange(len(prompts)), rng.randint(1, 40)
            (h,) = engine.submit([Request(prompts[i], SamplingParams(temperature=0, max_new_tokens=m))])
            origin[h] = (i, m)

    add(rng.randint(2, 8))
    while engine._queue or engine._rows or paused:
        r, live = rng.random(), list(engine._live)
        if r < 0.1 and live and len(origin) < 40:
            h = rng.choice(live)
            budgets = [rng.randint(len(engine._live[h].tokens) + 1, 45) for _ in range(rng.randint(1, 4))]
            kids = engine.fork(h, len(budgets), [SamplingParams(temperature=0, max_new_tokens=m) for m in budgets])
            origin.update((k, (origin[h][0], m)) for k, m in zip(kids, budgets))
        elif r < 0.18 and live:
            hs = rng.sample(live, rng.randint(1, len(live)))
            paused += [(origin[h], st) for h, st in zip(hs, engine.pause(hs))]
        elif (r < 0.25 and paused) or not (engine._queue or engine._rows):
            rng.shuffle(paused)
            k = rng.randint(1, len(paused))
            for o, st in paused[:k]:
                origin[engine.resume([st])[0]] = o
            paused = paused[k:]
        elif r < 0.28 and len(origin) < 40:
            add(rng.randint(1, 3))
        elif r < 0.30:
            engine.load_weights(tiny[0])
        done.update((c.handle, c) for c in engine.step())
    assert not engine._live and done
    for h, c in done.items():
        i, m = origin[h]
        assert c.token_ids == full[i][:m]
        assert len(c.versions) == len(c.token_ids) == len(c.logprobs) and c.versions == sorted(c.versions)


def test_cache_grows_under_running_sequences(tiny, prompts):
    short, long = SamplingParams(temperature=0, max_new_tokens=30), SamplingParams(temperature=0, max_new_tokens=150)
    refs = [engine_for(tiny).generate([Request(prompts[i], p)])[0].token_ids for i, p in ((3, short), (1, long))]
    engine = engine_for(tiny)
    (a,) = engine.submit([Request(prompts[3], short)])
    for _ in range(10):
        engine.step()
    capacity = engine._kv.capacity
    (b,) = engine.submit([Request(prompts[1], long)])  # needs more positions than the cache has
    outs = engine.run_until()
    assert engine._kv.capacity > capacity >= len(prompts[3]) + 30
    assert outs[a].token_ids == refs[0] and outs[b].token_ids == refs[1]


def test_occupancy_over_time_is_recorded(tiny, prompts):
    engine = engine_for(tiny, max_batch_size=4)
    lengths = [2, 5, 3]
    engine.generate([Request(prompts[i], SamplingParams(max_new_tokens=n, seed=i)) for i, n in enumerate(lengths)])
    # every step samples one token per running sequence; sequences drop out as they reach their length
    assert list(engine.stats.rows_per_step) == [3, 3, 2, 1, 1]
    assert sum(engine.stats.rows_per_step) == engine.stats.decode_tokens == sum(lengths)


def test_length_buckets_and_row_sorts_change_nothing(tiny):
    """Short rows running, then long prompts admitted behind them: the engine re-sorts rows by
    length and splits decode attention into length buckets; every request still samples
    exactly what it samples alone."""
    _, tok = tiny
    short = [tok(t)["input_ids"] for t in TEXTS] * 5  # 40 short prompts
    long = [tok("x" * 200 + t)["input_ids"] for t in TEXTS[:4]] * 4  # 16 long ones
    params = [SamplingParams(max_new_tokens=24, seed=100 + i) for i in range(len(short) + len(long))]
    engine = engine_for(tiny, max_batch_size=64)
    # admitted in waves of 5 short, 4 long, 5 short, ...: running rows alternate short and long
    prompts, handles, early = [], [], {}
    waves = [(short[i : i + 5], params[i : i + 5]) for i in range(0, 40, 5)]
    waves = [w for pair in zip(waves, [(long[i : i + 4], params[40 + i : 44 + i]) for i in range(0, 16, 4)] + [([], [])] * 4)
             for w in pair]
    for ps, sps in waves:
        handles += engine.submit([Request(p, sp) for p, sp in zip(ps, sps)])
        prompts += list(zip(ps, sps))
        early |= {c.handle: c for c in engine.step()}
    done = early | engine.run_until()
    assert engine.stats.row_sorts > 0
    alone = engine_for(tiny, max_batch_size=1)
    for h, (p, sp) in zip(handles, prompts):
        (want,) = alone.generate([Request(p, sp)])
        assert done[h].token_ids == want.token_ids
        assert torch.allclose(torch.tensor(done[h].logprobs), torch.tensor(want.logprobs), atol=ATOL)


def test_split_cost_cuts_only_when_it_pays():
    from rollwise.engine.buckets import split_cost

    cost, buckets = split_cost([10] * 40, 0, 40, depth=2)
    assert buckets == [(0, 40, 10)] and cost == 400  # uniform: one range
    spans = [200] * 16 + [10] * 48
    cost, buckets = split_cost(spans, 0, 64, depth=2)
    assert buckets[0] == (0, 16, 200) and cost == 16 * 200 + 48 * 10
    assert all(b - a >= 8 for a, b, _ in buckets)


# -- kept prompt prefixes (keep_prefixes) ---------------------------------------------------
def test_kept_prompt_prefix_skips_the_second_prefill(tiny, prompts):
    """A second round for prompts already prefilled copies their cached prefix in, feeds only the
    last prompt token, and samples what a fresh engine samples for the same seeds."""
    reqs = mixed_requests(prompts)
    engine = engine_for(tiny, max_batch_size=4)
    engine.keep_prefixes(len(prompts))
    engine.generate(reqs[:5])  # round 1 prefills prompts 0..4
    before = engine.stats.prefill_tokens
    again = [Request(r.prompt_ids, SamplingParams(**{**vars(r.params), "seed": 100 + i})) for i, r in enumerate(reqs)]
    second = engine.generate(again)
    long_enough = [p for p in prompts[:5] if len(p) >= 2]
    assert engine.stats.prefix_cache_hits == len(long_enough)
    assert engine.stats.prefix_cache_tokens == sum(len(p) - 1 for p in long_enough)
    # hits feed one token each; the other prompts are prefilled in full
    assert engine.stats.prefill_tokens - before == len(long_enough) + sum(
        len(p) for i, p in enumerate(prompts) if not (i < 5 and len(p) >= 2))
    fresh = engine_for(tiny, max_batch_size=4).generate(again)
    for out, ref in zip(second, fresh):
        assert out.token_ids == ref.token_ids and out.finish_reason == ref.finish_reason
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=ATOL, rtol=0)


def test_kept_prefix_serves_a_queued_fork_family(tiny, prompts):
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=11)
    engine = engine_for(tiny, max_batch_size=4)
    engine.keep_prefixes(4)
    engine.generate([Request(prompts[3], SamplingParams(max_new_tokens=2))])
    before = engine.stats.prefill_tokens
    (h,) = engine.submit([Request(prompts[3], params)])
    children = engine.fork(h, 6)  # 4 slots: one hit + three copies of it; the last two wait
    outs = engine.run_until()
    # the first four run 10 tokens and end together, so the last two find no running sibling:
    # they take the kept prefix too (without it they would re-prefill the prompt)
    assert engine.stats.prefix_cache_hits == 2 and engine.stats.reprefill_tokens == 0
    # no prompt prefilled: each of the six feeds the prompt's last token into its own row
    assert engine.stats.prefill_tokens - before == 6
    plain = engine_for(tiny).generate([Request(prompts[3], SamplingParams(temperature=1.0, max_new_tokens=10,
                                                                          seed=child_seed(11, i))) for i in range(6)])
    assert [outs[c].token_ids for c in children] == [p.token_ids for p in plain]


def test_kept_prefixes_are_forgotten_with_new_weights_and_bounded(tiny, prompts):
    model, tok = tiny
    engine = engine_for(tiny, max_batch_size=4)
    engine.keep_prefixes(2)
    engine.generate([Request(p, SamplingParams(max_new_tokens=2)) for p in prompts[:4]])
    assert len(engine._prefixes) == 2  # least recently used dropped
    engine.load_weights(model)
    assert not engine._prefixes
    engine.generate([Request(prompts[0], SamplingParams(max_new_tokens=2))])
    engine.keep_prefixes(0)
    assert not engine._prefixes
    engine.generate([Request(prompts[0], SamplingParams(max_new_tokens=2))])
    assert engine.stats.prefix_cache_hits == 0
    with pytest.raises(ValueError, match="keep_prefixes"):
        engine.keep_prefixes(-1)


# -- a prefix shared by different prompts (a chat template's system prompt) -------------------
SYSTEM = "You are a careful calculator. Answer with the number only.\n"


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_common_prefix_of_different_prompts_is_prefilled_once(tiny, arch):
    model, tok = tiny
    if arch == "mistral":  # a sliding window shorter than the shared prefix: the suffix must not see past it
        torch.manual_seed(0)
        model = redraw(MistralForCausalLM(small_config(MistralConfig, sliding_window=6)))
    prompts = [tok(SYSTEM + t)["input_ids"] for t in ("12+3=", "99*9=", "7-2=", "hello")]
    common = len(tok(SYSTEM)["input_ids"])
    assert common >= 16 and len({tuple(p) for p in prompts}) == len(prompts)
    reqs = [Request(p, SamplingParams(temperature=1.0, max_new_tokens=12, seed=i)) for i, p in enumerate(prompts)]
    shared = Recording(model, pad_token_id=tok.pad_token_id, share_prefix_min=16)
    plain = Recording(model, pad_token_id=tok.pad_token_id, share_prefix_min=0)
    outs_shared, outs_plain = shared.generate(reqs), plain.generate(reqs)
    # the prefix was computed once and copied to the three other rows; the plain engine computed it 4 times
    assert shared.stats.prefix_tokens_shared >= 3 * common and plain.stats.prefix_tokens_shared == 0
    assert plain.stats.prefill_tokens - shared.stats.prefill_tokens == shared.stats.prefix_tokens_shared
    for a, b in zip(outs_shared, outs_plain):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=ATOL, rtol=0)
    for h in shared.seen:  # every distribution sampled from, the first one (after the prefill) included
        torch.testing.assert_close(torch.stack(shared.seen[h]), torch.stack(plain.seen[h]), atol=ATOL, rtol=0)


def test_common_prefix_shorter_than_the_minimum_is_not_shared(tiny):
    _, tok = tiny
    prompts = [tok(t)["input_ids"] for t in ("12+3=", "12+4=")]
    engine = engine_for(tiny, share_prefix_min=16)
    engine.generate([Request(p, SamplingParams(temperature=0, max_new_tokens=4)) for p in prompts])
    assert engine.stats.prefix_tokens_shared == 0
