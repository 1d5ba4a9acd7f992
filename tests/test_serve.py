"""The OpenAI-compatible endpoint (``rollwise.serve``, ``rollwise serve``) through the official
``openai`` client, sync and async, on the tiny model's slot engine.

One server per module (its driver on a daemon thread): sampling parameters, log-probs checked
against a forward pass of the model, streaming, stop strings, continuous batching of concurrent
clients, episodes (token-faithful chaining from the kept cache), errors in OpenAI's shape and a
client that goes away mid-stream. Tool calls are read from a scripted engine's fixed output (a
random model writes none). Nothing here asserts a duration: waits are bounded only so a bug
fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tinymodel import tiny_redrawn

openai = pytest.importorskip("openai", reason="the serve extra is not installed: pip install 'rollwise[serve]'")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from rollwise.engine.engine import Completion  # noqa: E402
from rollwise.engine.slots import SlotEngine  # noqa: E402
from rollwise.engine.state import SequenceView  # noqa: E402
from rollwise.serve import serve_engine  # noqa: E402
from rollwise.tasks.tool_calls import tool_format  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
HI = [{"role": "user", "content": "Hi"}]


class StallingEngine(SlotEngine):
    """The slot engine, with a hold: once ``stats.steps`` reaches ``stall_at``, ``step`` waits for
    ``release`` — so a test can act while a sequence is certainly unfinished."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stall_at: int | None = None
        self.release = threading.Event()

    def step(self):
        if self.stall_at is not None and self.stats.steps >= self.stall_at:
            self.release.wait(timeout=60)
        return super().step()


def start(engine, tok, fmt, **options):
    """A started endpoint on ``engine`` with its driver on a daemon thread; ``stop()`` ends both
    (``options``: ``serve_engine``'s)."""
    server = serve_engine(engine, tok, fmt, model_name=MODEL, **options)
    halt = threading.Event()
    driver = threading.Thread(target=server.drive, args=(halt.is_set,), daemon=True)
    driver.start()

    def stop():
        halt.set()
        driver.join(timeout=10)
        server.close()

    return server, stop


@pytest.fixture(scope="module")
def served():
    model, tok = tiny_redrawn()  # re-drawn matrices: completions vary and some end in EOS
    engine = StallingEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=32, seed=0)
    server, stop = start(engine, tok, tool_format("plain", tok))
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    yield SimpleNamespace(server=server, engine=engine, model=model, tok=tok, client=client,
                          service=server.service, seeds={})
    client.close()
    stop()


def ids_of(tok, pieces: list[str]) -> list[int]:
    """Token ids back from the logprobs' token texts (the character tokenizer: one character, or <eos>, per id)."""
    ids = tok.convert_tokens_to_ids(pieces)
    assert tok.unk_token_id not in ids and None not in ids
    return ids


def sampled_ids(tok, choice) -> list[int]:
    return ids_of(tok, [t.token for t in choice.logprobs.content])


def model_logprobs(model, prompt: list[int], ids: list[int], temperature: float, top_p: float) -> list[float]:
    """The model's own log-probs of ``ids`` after ``prompt`` under temperature and a top-p nucleus
    (written out here, not the engine's sampler)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1].double() / temperature
    out = []
    for row, t in zip(logits, ids):
        probs = row.softmax(-1)
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # mass strictly before each token, best first
        kept = order[before < top_p]
        out.append(float(row[t] - row[kept].logsumexp(0)) if t in kept.tolist() else float("-inf"))
    return out


def prompt_ids(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]  # the plain format: the user's text after <bos>


def first_seed(s, finish: str, max_tokens: int) -> int:
    """The first seed whose untagged reply to ``HI`` ends with ``finish`` ("stop": EOS within
    ``max_tokens``; "length": none) — deterministic, found once per run (kept on the fixture)."""
    if (finish, max_tokens) in s.seeds:
        return s.seeds[finish, max_tokens]
    for seed in range(50):
        r = s.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=max_tokens, seed=seed)
        if r.choices[0].finish_reason == finish:
            s.seeds[finish, max_tokens] = seed
            return seed
    raise AssertionError(f"no seed under 50 finishes with {finish!r} in {max_tokens} tokens")


# -- parameters, log-probs, streaming, stop strings --------------------------------------------------
def test_models_lists_the_served_model(served):
    assert [m.id for m in served.client.models.list().data] == [MODEL]
    assert httpx.get(served.server.url.removesuffix("/v1") + "/health").json()["status"] == "ok"


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_n_choices_with_their_logprobs_usage_and_seed(served, temperature, top_p):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "12+34="}], n=2, temperature=temperature,
              top_p=top_p, max_tokens=12, seed=7, logprobs=True)
    r = served.client.chat.completions.create(**kw)
    prompt = prompt_ids(served.tok, "12+34=")
    assert r.model == MODEL and r.object == "chat.completion" and len(r.choices) == 2
    assert [c.index for c in r.choices] == [0, 1]
    per_choice = []
    for c in r.choices:
        ids = sampled_ids(served.tok, c)
        per_choice.append(ids)
        ended = ids[-1] == served.tok.eos_token_id
        assert c.finish_reason == ("stop" if ended else "length") and (ended or len(ids) == 12)
        assert c.message.role == "assistant" and c.message.tool_calls is None
        assert c.message.content == served.tok.decode(ids, skip_special_tokens=True)
        got = [t.logprob for t in c.logprobs.content]
        want = model_logprobs(served.model, prompt, ids, temperature, top_p)
        assert got == pytest.approx(want, abs=1e-4)
    assert per_choice[0] != per_choice[1]  # each choice samples with its own seed
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == sum(map(len, per_choice))
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = served.client.chat.completions.create(**kw)
    assert [sampled_ids(served.tok, c) for c in again.choices] == per_choice


def test_greedy_logprobs_are_zero(served):
    r = served.client.chat.completions.create(model=MODEL, messages=HI, temperature=0, max_tokens=6, logprobs=True)
    assert [t.logprob for t in r.choices[0].logprobs.content] == [0.0] * r.usage.completion_tokens


def test_streamed_deltas_are_the_completion(served):
    kw = dict(model=MODEL, messages=HI, max_tokens=24, seed=11, n=2)
    whole = served.client.chat.completions.create(**kw)
    chunks = list(served.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" and ch.model == MODEL for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    for i, choice in enumerate(whole.choices):
        mine = [c for ch in chunks for c in ch.choices if c.index == i]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        finishes = [c.finish_reason for c in mine if c.finish_reason]
        assert finishes == [choice.finish_reason] and mine[-1].finish_reason
    usage = [ch.usage for ch in chunks if ch.usage]
    assert len(usage) == 1 and not chunks[-1].choices and chunks[-1].usage == usage[0]
    assert usage[0].model_dump() == whole.usage.model_dump()


def test_a_stream_without_usage_sends_none(served):
    chunks = list(served.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, seed=1, stream=True))
    assert all(ch.usage is None for ch in chunks) and chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_cuts_the_text(served, stream):
    kw = dict(model=MODEL, messages=HI, max_tokens=24, seed=2)
    text = served.client.chat.completions.create(**kw).choices[0].message.content
    assert len(text) >= 8  # seed 2 writes on
    stop = text[5:7]
    want = text.split(stop, 1)[0]
    if stream:
        chunks = list(served.client.chat.completions.create(**kw, stop=[stop, "@@never@@"], stream=True))
        got = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
        finish = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
    else:
        r = served.client.chat.completions.create(**kw, stop=stop)
        got, finish = r.choices[0].message.content, [r.choices[0].finish_reason]
    assert got == want and stop not in got and finish == ["stop"]


# -- concurrent clients share the engine's steps -----------------------------------------------------
def test_concurrent_requests_are_batched_and_sample_as_alone(served):
    requests = [dict(model=MODEL, messages=[{"role": "user", "content": f"{i}+{i}="}], max_tokens=16, seed=100 + i,
                     temperature=1.0, logprobs=True) for i in range(32)]

    async def together():
        async with openai.AsyncOpenAI(base_url=served.server.url, api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(client.chat.completions.create(**kw) for kw in requests))

    before = served.engine.stats.steps
    batched = asyncio.run(together())
    steps = served.engine.stats.steps - before
    tokens = sum(r.usage.completion_tokens for r in batched)
    assert steps < tokens  # they shared steps (32 alone would take one step per token)
    alone = [served.client.chat.completions.create(**kw) for kw in requests]
    # same seeds, same token ids: a request's sampling does not depend on its batch-mates (no float
    # effect of batch shape was large enough to flip a token here)
    assert [sampled_ids(served.tok, r.choices[0]) for r in batched] == \
        [sampled_ids(served.tok, r.choices[0]) for r in alone]
    for b, a in zip(batched, alone):
        assert [t.logprob for t in b.choices[0].logprobs.content] == \
            pytest.approx([t.logprob for t in a.choices[0].logprobs.content], abs=1e-4)


# -- episodes --------------------------------------------------------------------------------------
def test_an_episode_continues_token_faithfully_from_the_kept_cache(served):
    s, tok = served, served.tok
    seed = first_seed(s, "stop", 48)
    ep1 = openai.OpenAI(base_url=s.server.episode_url("ep1"), api_key="unused", max_retries=0)
    r1 = ep1.chat.completions.create(model=MODEL, messages=HI, max_tokens=48, seed=seed)
    assert r1.choices[0].finish_reason == "stop"
    history = HI + [{"role": "assistant", "content": r1.choices[0].message.content}]
    stats = s.engine.stats
    restored, prefilled = stats.restored_tokens, stats.prefill_tokens
    r2 = ep1.chat.completions.create(model=MODEL, messages=history + [{"role": "user", "content": "More"}],
                                     max_tokens=8)
    log = s.service.episodes["ep1"]
    call1, call2 = (c.choices[0] for c in log.calls)
    more = tok("More", add_special_tokens=False)["input_ids"]
    assert call1.ids[-1] == tok.eos_token_id
    assert call2.prompt_ids == call1.prompt_ids + call1.ids + more  # the sampled ids, never re-tokenized
    assert r2.usage.prompt_tokens == len(call2.prompt_ids) and r2.usage.completion_tokens == len(call2.ids)
    assert r2.choices[0].message.content == tok.decode(call2.ids, skip_special_tokens=True)
    # the cache of call 1 was copied back: only its last sampled id (EOS, never fed) and "More" were prefilled
    assert stats.restored_tokens - restored == len(call1.prompt_ids) + len(call1.ids) - 1
    assert stats.prefill_tokens - prefilled == 1 + len(more)

    # rewriting the assistant's turn is a fresh prompt, not an extension
    restored = stats.restored_tokens
    ep1.chat.completions.create(model=MODEL, messages=[HI[0], {"role": "assistant", "content": "Hello"},
                                                       {"role": "user", "content": "More"}], max_tokens=4)
    call3 = log.calls[2].choices[0]
    assert call3.prompt_ids == prompt_ids(tok, "Hi") + tok("Hello", add_special_tokens=False)["input_ids"] + [
        tok.eos_token_id] + more
    assert call3.prompt_ids[: len(call2.prompt_ids) - len(more)] != call1.prompt_ids + call1.ids
    assert stats.restored_tokens == restored

    # another tag does not see ep1's calls: the same conversation is rendered afresh there
    ep2 = openai.OpenAI(base_url=s.server.episode_url("ep2"), api_key="unused", max_retries=0)
    ep2.chat.completions.create(model=MODEL, messages=history + [{"role": "user", "content": "More"}], max_tokens=4)
    assert len(s.service.episodes["ep2"].calls) == 1 and len(log.calls) == 3
    assert stats.restored_tokens == restored
    ep1.close()
    ep2.close()


def test_only_the_most_recently_used_episodes_keep_their_cache(served):
    """A standalone server keeps the KV of at most ``max_cached`` episodes' last calls (least recently
    used dropped): memory is bounded, and a dropped episode is still continued token-faithfully."""
    s = served
    s.service.episodes.max_cached, kept = 2, s.service.episodes.max_cached
    try:
        for tag in ("lru-a", "lru-b", "lru-c"):
            s.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3,
                                             extra_headers={"X-Rollwise-Episode": tag})
        has_kv = {tag: s.service.episodes[tag].calls[-1].choices[0].completion is not None
                  and s.service.episodes[tag].calls[-1].choices[0].completion.kv is not None
                  for tag in ("lru-a", "lru-b", "lru-c")}
        assert has_kv == {"lru-a": False, "lru-b": True, "lru-c": True}
    finally:
        s.service.episodes.max_cached = kept


def test_the_episode_header_tags_the_plain_route(served):
    served.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3,
                                          extra_headers={"X-Rollwise-Episode": "by-header"})
    (call,) = served.service.episodes["by-header"].calls
    assert call.choices[0].prompt_ids == prompt_ids(served.tok, "Hi")



# -- a training run's episodes: its seeds, its call indices ------------------------------------------
def test_a_run_episode_ignores_the_request_seed(served):
    """An episode the run opened samples call k with its own key whatever ``seed`` the harness sends
    (a harness passing seed=1234 must not give every episode of a group the same tokens); a tag
    the server opened itself (standalone serving) honours the request's seed."""
    s = served
    kw = dict(model=MODEL, messages=HI, max_tokens=16)
    texts = {}
    for tag, key, seed in [("run-a", (5, 0, 0), 1234), ("run-b", (5, 0, 1), 1234), ("run-a2", (5, 0, 0), None)]:
        s.service.episodes.open(tag, key)
        ep = openai.OpenAI(base_url=s.server.episode_url(tag), api_key="unused", max_retries=0)
        texts[tag] = ep.chat.completions.create(**kw, **({} if seed is None else {"seed": seed})).choices[0]
        ep.close()
        s.service.episodes.close(tag)
    assert texts["run-a"].message.content == texts["run-a2"].message.content  # the key decides, not seed=1234
    assert texts["run-a"].message.content != texts["run-b"].message.content  # the group's episodes differ
    standalone = [s.client.chat.completions.create(**kw, seed=1234, extra_headers={"X-Rollwise-Episode": tag})
                  .choices[0].message.content for tag in ("own-a", "own-b")]
    assert standalone[0] == standalone[1]  # a server-opened tag: seed=1234 is honoured


def test_concurrent_calls_on_one_episode_take_distinct_call_indices(served):
    """4 identical requests in flight at once on one episode sample as its calls 0..3 would one after
    another (each call's index is taken when it starts), and are recorded in that order."""
    s = served
    kw = dict(model=MODEL, messages=HI, max_tokens=16, logprobs=True)
    s.service.episodes.open("seq", (9, 1, 0))
    ep = openai.OpenAI(base_url=s.server.episode_url("seq"), api_key="unused", max_retries=0)
    one_by_one = [sampled_ids(s.tok, ep.chat.completions.create(**kw).choices[0]) for _ in range(4)]
    ep.close()
    assert len({tuple(ids) for ids in one_by_one}) == 4

    async def together():
        async with openai.AsyncOpenAI(base_url=s.server.episode_url("gather"), api_key="unused",
                                      max_retries=0) as client:
            return await asyncio.gather(*(client.chat.completions.create(**kw) for _ in range(4)))

    s.service.episodes.open("gather", (9, 1, 0))
    s.engine.release.clear()
    s.engine.stall_at = s.engine.stats.steps  # hold the engine so all 4 are in flight before any finishes
    try:
        work = threading.Thread(target=lambda: box.append(asyncio.run(together())), daemon=True)
        box: list = []
        work.start()
        wait_for(lambda: len(s.service.episodes["gather"].jobs) == 4, "4 calls in flight")
    finally:
        s.engine.stall_at = None
        s.engine.release.set()
    work.join(timeout=60)
    assert box, "the concurrent calls did not finish"
    together_ids = [sampled_ids(s.tok, r.choices[0]) for r in box[0]]
    assert sorted(together_ids) == sorted(one_by_one)  # 4 distinct samples: calls 0..3, not call 0 four times
    assert [c.choices[0].ids for c in s.service.episodes.close("gather").calls] == one_by_one  # recorded by index
    s.service.episodes.close("seq")


# -- a training run's episode budget: tokens across segments and choices, n and segments capped ----
@contextlib.contextmanager
def run_limits(service, **limits):
    kept = {k: getattr(service, k) for k in limits}
    for k, v in limits.items():
        setattr(service, k, v)
    try:
        yield
    finally:
        for k, v in kept.items():
            setattr(service, k, v)


def test_the_episode_budget_counts_every_segment_and_choice(scripted):
    """``episode_budget`` bounds the tokens an episode samples in all: a rewritten history or a
    second choice does not get the budget again."""
    s = scripted
    s.engine.text = "abcd"  # 4 ids + EOS per choice
    tag = "budget"
    s.service.episodes.open(tag, (1, 2, 3))
    ep = openai.OpenAI(base_url=s.server.episode_url(tag), api_key="unused", max_retries=0)
    with run_limits(s.service, episode_budget=13):
        r1 = ep.chat.completions.create(model=MODEL, messages=HI)  # 5 sampled
        rewritten = [{"role": "user", "content": "Hello"}]  # a fresh segment: 5 more
        r2 = ep.chat.completions.create(model=MODEL, messages=rewritten)
        assert r1.usage.completion_tokens == r2.usage.completion_tokens == 5
        r3 = ep.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Again"}])
        assert r3.usage.completion_tokens == 3 and r3.choices[0].finish_reason == "length"  # what is left
        with pytest.raises(openai.BadRequestError) as err:
            ep.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Yet again"}])
        assert err.value.code == "episode_budget_exhausted" and "13" in err.value.message
    s.service.episodes.close(tag)

    s.service.episodes.open(tag, (1, 2, 3))
    with run_limits(s.service, episode_budget=12):
        r = ep.chat.completions.create(model=MODEL, messages=HI, n=2)  # 2 choices share what is left: 6 each
        assert r.usage.completion_tokens == 10
        with pytest.raises(openai.BadRequestError) as err:
            ep.chat.completions.create(model=MODEL, messages=HI, n=3)  # 2 left: not one token for each choice
        assert err.value.code == "episode_budget_exhausted"
    s.service.episodes.close(tag)
    ep.close()


def test_a_run_caps_n_and_segments(scripted):
    s = scripted
    s.engine.text = "ab"
    tag = "caps"
    s.service.episodes.open(tag, (4, 5, 6))
    ep = openai.OpenAI(base_url=s.server.episode_url(tag), api_key="unused", max_retries=0)
    with run_limits(s.service, max_n=2, max_segments=3):
        with pytest.raises(openai.BadRequestError) as err:
            ep.chat.completions.create(model=MODEL, messages=HI, n=3)
        assert err.value.param == "n" and "2" in err.value.message
        ep.chat.completions.create(model=MODEL, messages=HI, n=2)  # 2 segments
        r = ep.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])  # the 3rd
        # continuing a returned choice extends its segment: allowed past the cap
        ep.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}, {
            "role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "y"}])
        with pytest.raises(openai.BadRequestError) as err:  # a 4th segment
            ep.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "z"}])
        assert err.value.code == "episode_budget_exhausted" and "segments" in err.value.message
        assert len(s.service.episodes[tag].calls) == 3
    # a standalone tag is not capped (the defaults are None)
    for _ in range(4):
        s.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "z"}], n=3,
                                         extra_headers={"X-Rollwise-Episode": "uncapped"})
    s.service.episodes.close(tag)
    s.service.episodes.close("uncapped")
    ep.close()

# -- errors: OpenAI's shape, and the server keeps serving --------------------------------------------
def still_serves(served) -> None:
    r = served.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_an_unknown_model_is_not_found(served):
    with pytest.raises(openai.NotFoundError) as err:
        served.client.chat.completions.create(model="gpt-5", messages=HI)
    assert err.value.code == "model_not_found" and err.value.param == "model" and MODEL in err.value.message
    still_serves(served)


@pytest.mark.parametrize("messages, param", [
    ([{"role": "wizard", "content": "x"}], "messages.0.role"),
    ([{"role": "user", "content": 5}], "messages.0.content"),
    ([], "messages"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "messages"),
])
def test_malformed_messages_are_bad_requests(served, messages, param):
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(model=MODEL, messages=messages)
    assert err.value.status_code == 400 and err.value.type == "invalid_request_error"
    assert err.value.param.startswith(param) and param in err.value.message
    still_serves(served)


@pytest.mark.parametrize("body, param", [
    ('{"model": "tiny", "messages": [', "body"),  # not JSON
    ('{"model": "tiny"}', "messages"),  # no messages
    ("[1, 2]", "body"),  # not an object
    ('{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', "top_logprobs"),
])
def test_a_bad_body_is_a_400_in_openais_shape(served, body, param):
    r = httpx.post(served.server.url + "/chat/completions", content=body,
                   headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"
    still_serves(served)


def test_a_completion_longer_than_the_context_is_refused(served):
    with pytest.raises(openai.BadRequestError) as err:
        served.client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10_000)
    assert err.value.code == "context_length_exceeded" and err.value.param == "max_tokens"
    assert "512" in err.value.message
    still_serves(served)


def test_a_client_gone_mid_stream_is_aborted(served):
    s = served
    kw = dict(model=MODEL, messages=HI, max_tokens=200, seed=first_seed(s, "length", 200))  # 200 ids unless stopped
    aborted = s.engine.stats.aborted
    with stalled_after_4_steps(s, aborted):  # the stream runs 4 steps, then waits for the test
        with httpx.stream("POST", s.server.url + "/chat/completions", json=kw | {"stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk: the job is in the engine
        # the client hung up (4 tokens at most sampled); the server notices and cancels the job, which the
        # driver aborts before its next step (at once, or after the held step is released)
    wait_for(lambda: s.engine.stats.aborted == aborted + 1, "the engine to abort the sequence")
    wait_for(lambda: not s.service.driver._jobs, "the driver to forget the job")
    still_serves(served)


def test_a_client_gone_before_its_answer_is_aborted(served):
    s = served
    kw = dict(model=MODEL, messages=HI, max_tokens=200, seed=first_seed(s, "length", 200))
    aborted = s.engine.stats.aborted
    with stalled_after_4_steps(s, aborted):  # the sequence cannot finish before the client gives up
        with pytest.raises(httpx.TimeoutException):
            httpx.post(s.server.url + "/chat/completions", json=kw, timeout=0.5)
    wait_for(lambda: s.engine.stats.aborted == aborted + 1, "the engine to abort the sequence")
    still_serves(served)


@contextlib.contextmanager
def stalled_after_4_steps(s, aborted: int):
    """Hold the engine 4 steps from now while the body runs a client that goes away; on leaving, wait
    until the server has seen the disconnect (the job aborted or cancelled), then let the engine go."""
    s.engine.release.clear()
    s.engine.stall_at = s.engine.stats.steps + 4
    try:
        yield
        # a liveness bound, not a timing: it took over 30 s once at load average 7 (session 15's suite)
        wait_for(lambda: s.engine.stats.aborted > aborted or any(job.cancelled for job in s.service.driver._jobs),
                 "the server to see the disconnect", bound=180.0)
    finally:
        s.engine.stall_at = None
        s.engine.release.set()


def wait_for(condition, what: str, bound: float = 30.0) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"waited {bound:.0f} s for {what}"
        time.sleep(0.01)


# -- tool calls: a scripted engine writes them ------------------------------------------------------
class ScriptedEngine:
    """What the driver calls of an engine, writing ``text`` then EOS for every request in one step
    (log-prob -0.5 per id); records each prompt's ids."""

    version, max_len = 0, 512

    def __init__(self, tok, text: str = ""):
        self.tok, self.text, self.prompts = tok, text, []
        self._live: dict[int, Completion] = {}
        self._handles = 0

    def submit(self, requests):
        handles = []
        for r in requests:
            self.prompts.append(list(r.prompt_ids))
            ids = self.tok(self.text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            ids = ids[: r.params.max_new_tokens]
            self._handles += 1
            reason = "stop" if ids[-1] == self.tok.eos_token_id else "length"
            self._live[self._handles] = Completion(self._handles, list(r.prompt_ids), ids, [-0.5] * len(ids),
                                                   [0] * len(ids), reason)
            handles.append(self._handles)
        return handles

    def step(self):
        done, self._live = list(self._live.values()), {}
        return done

    def peek(self, handle):
        c = self._live[handle]
        return SequenceView(c.token_ids, c.logprobs, c.versions, None)

    def abort(self, handles):
        for h in handles:
            self._live.pop(h, None)


ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}


@pytest.fixture(scope="module")
def scripted():
    _, tok = tiny_redrawn()
    engine = ScriptedEngine(tok)
    server, stop = start(engine, tok, tool_format("plain", tok))
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    yield SimpleNamespace(server=server, engine=engine, tok=tok, client=client, service=server.service)
    client.close()
    stop()


def test_a_tool_call_is_returned_as_tool_calls(scripted):
    scripted.engine.text = "Adding. <call>add(1, 2)</call><call>add(3, b=4.5)</call>"
    r = scripted.client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Adding."
    calls = choice.message.tool_calls
    assert [c.type for c in calls] == ["function", "function"] and all(c.id.startswith("call_") for c in calls)
    assert [c.function.name for c in calls] == ["add", "add"]
    # the plain format's positional arguments are named by the tool's schema
    assert [json.loads(c.function.arguments) for c in calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4.5}]


def test_without_tools_or_with_tool_choice_none_the_text_is_content(scripted):
    scripted.engine.text = "<call>add(1, 2)</call>"
    for extra in ({}, {"tools": [ADD], "tool_choice": "none"}):
        (choice,) = scripted.client.chat.completions.create(model=MODEL, messages=HI, **extra).choices
        assert choice.finish_reason == "stop" and choice.message.content == scripted.engine.text
        assert choice.message.tool_calls is None


def test_a_botched_call_is_left_as_text(scripted):
    scripted.engine.text = "<call>add(1, </call>"
    (choice,) = scripted.client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD]).choices
    assert choice.finish_reason == "stop" and choice.message.content == scripted.engine.text


def test_a_streamed_tool_call_comes_whole_at_the_end(scripted):
    scripted.engine.text = "Adding. <call>add(1, 2)</call>"
    chunks = list(scripted.client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], stream=True))
    deltas = [c for ch in chunks for c in ch.choices]
    assert [c.delta.role for c in deltas] == ["assistant", None] and deltas[0].delta.content == ""
    last = deltas[-1]
    assert last.finish_reason == "tool_calls" and last.delta.content == "Adding."
    (call,) = last.delta.tool_calls
    assert call.index == 0 and call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}


def test_a_tool_result_extends_the_recorded_call(scripted):
    s, tok = scripted, scripted.tok
    ep = openai.OpenAI(base_url=s.server.episode_url("tools"), api_key="unused", max_retries=0)
    s.engine.text = "<call>add(1, 2)</call>"
    r1 = ep.chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    call = r1.choices[0].message.tool_calls[0]
    s.engine.text = "3"
    messages = HI + [r1.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    r2 = ep.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
    first, second = (c.choices[0] for c in s.service.episodes["tools"].calls)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert first.ids == ids("<call>add(1, 2)</call>") + [tok.eos_token_id]
    assert s.engine.prompts[-1] == second.prompt_ids == first.prompt_ids + first.ids + ids("<result>3</result>")
    assert r2.choices[0].message.content == "3" and r2.choices[0].finish_reason == "stop"
    ep.close()


# -- the command -------------------------------------------------------------------------------------
def test_rollwise_serve_tiny_answers_an_openai_client():
    """... with the API key from ROLLWISE_API_KEY (a request without it: 401). On --port 0, a port the server
    binds itself and prints: a port number found free here could be taken by another process (pytest -n)
    before the server binds it, and the health check would then ask someone else's server."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "ROLLWISE_API_KEY": "sesame"}
    proc = subprocess.Popen([sys.executable, "-m", "rollwise.cli", "serve", "tiny", "--port", "0",
                             "--max-tokens", "8", "--max-batch-size", "4"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()  # "serving 'tiny' (...) at http://127.0.0.1:PORT/v1 — Ctrl-C stops"
        found = re.search(r"at (http://127\.0\.0\.1:[1-9][0-9]*)/v1 ", banner)
        assert found, (banner, proc.stderr.read() if proc.poll() is not None else "")
        url = found[1]

        def healthy() -> bool:
            assert proc.poll() is None, proc.stderr.read()
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, "rollwise serve to start", bound=120)
        assert httpx.get(url + "/v1/models").status_code == 401
        with openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0) as client:
            assert [m.id for m in client.models.list().data] == ["tiny"]
            r = client.chat.completions.create(model="tiny", messages=HI, seed=0)
        assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"  # --max-tokens
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"{url}/v1" in banner


def test_rollwise_serve_a_missing_model_is_a_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from rollwise.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "Traceback" not in result.output
