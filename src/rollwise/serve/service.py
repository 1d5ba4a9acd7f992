"""What one chat-completions request does, apart from HTTP: render, sample, record, answer.

``ChatService.complete(request, tag)`` renders the conversation to prompt ids, hands the engine
work to the ``EngineDriver`` and builds OpenAI's response (or its stream of chunks).

**Episodes** (``tag``: the ``/episodes/{tag}/v1`` base URL, or the ``X-Rollwise-Episode``
header): every call of a tagged conversation is recorded — its prompt ids, the ids each choice
sampled, their behaviour log-probs and policy versions (``Call``). When a request's messages
are an earlier call's messages + the assistant message that call returned + new tool or user
messages, its prompt is *that call's prompt + the sampled ids + the ids of the new messages*
(``ChatRenderer.suffix_ids``): the sampled ids are never decoded and re-tokenized, so call k+1
extends call k token for token (METHODS ``token_faithful``), and on an engine that keeps a
finished sequence's keys/values (``SlotEngine``, ``SamplingParams.keep_cache``) only the new
ids are prefilled. A request that rewrites history is rendered afresh (a new segment of the
trajectory). ``close(tag)`` hands the record over and forgets it.

Seeds: a request's ``seed``, else the episode's key and the call's index (a training run opens
episode (step seed, prompt slot, sample) whose call k samples as an in-process episode's turn k),
else the service's seed and a counter — so a training run's harness calls sample the same
tokens every run.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from rollwise.engine.engine import Completion, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import continuation
from rollwise.generate.conversation import ChatRenderer
from rollwise.seeds import derive
from rollwise.serve.driver import EngineDriver, Job
from rollwise.serve.schema import (ApiError, ChatRequest, Message, completion_id, envelope, token_logprobs)

TAGGED, UNTAGGED = 1, 2  # seed-derivation keys of a server's own tags and of untagged requests (ints: derive hashes)


@dataclass
class Choice:
    """One sampled assistant turn of a recorded call."""

    prompt_ids: list[int]  # this call's whole prompt
    ids: list[int]  # the ids it sampled
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    key: tuple = ()  # the assistant message returned (Message.key)
    ended: bool = False  # ended with an end-of-turn id: the conversation can go on after it token-faithfully
    start: int = 0  # length of the first prompt of the chain this call continues (the episode's budget counts from it)
    completion: Completion | None = field(default=None, repr=False)  # kept for the continuation's cache


@dataclass
class Call:
    keys: list[tuple]  # the request's messages (Message.key)
    choices: list[Choice]
    messages: list[dict] = field(default_factory=list)  # the request's messages (as the chat template reads them)


@dataclass
class EpisodeLog:
    key: tuple[int, ...]  # call k's choice 0 samples with seed derive(*key, k) (an in-process episode's turn k's)
    calls: list[Call] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)


class ChatService:
    def __init__(self, driver: EngineDriver, tokenizer, fmt, *, model_name: str, max_len: int, seed: int = 0,
                 default_max_tokens: int = 512, max_episodes: int = 4096, max_cached: int = 256,
                 sampling: SamplingParams | None = None,
                 episode_budget: int | None = None):
        self.driver, self.tokenizer, self.fmt = driver, tokenizer, fmt
        self.renderer = ChatRenderer(tokenizer, fmt)
        self.model_name, self.max_len, self.seed = model_name, max_len, seed
        self.default_max_tokens = default_max_tokens
        self.max_episodes = max_episodes  # tags a standalone server keeps (oldest forgotten first)
        # episodes whose last call keeps its KV cache to continue from (least recently used dropped first:
        # a dropped one is prefilled whole on its next call); a SmolLM2 episode of 500 tokens holds ~23 MB
        self.max_cached = max_cached
        # a training run's settings: temperature, top-p and top-k are the run's whatever a request asks (the
        # update recomputes log-probs under them), and an episode's tokens past its first prompt are capped
        self.sampling, self.episode_budget = sampling, episode_budget
        self.episodes: OrderedDict[str, EpisodeLog] = OrderedDict()
        self.stop_ids = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
        self._counter = 0

    @property
    def engine(self):
        return self.driver.engine

    # -- episodes ---------------------------------------------------------------------------------
    def open(self, tag: str, key: tuple[int, ...]) -> None:
        self.episodes[tag] = EpisodeLog(tuple(key))

    def close(self, tag: str) -> EpisodeLog | None:
        """Forget an episode (its unfinished requests are aborted); return its record."""
        self.cancel(tag)
        return self.episodes.pop(tag, None)

    def cancel(self, tag: str) -> None:
        """Abort an episode's unfinished requests (at the engine's next step); keep its record."""
        log = self.episodes.get(tag)
        for job in list(log.jobs) if log else []:
            job.cancel()

    def _log(self, tag: str | None) -> EpisodeLog | None:
        if tag is None:
            return None
        if tag not in self.episodes:
            self.open(tag, (self.seed, TAGGED, zlib.crc32(tag.encode())))
            while len(self.episodes) > self.max_episodes:
                self.episodes.popitem(last=False)
        self.episodes.move_to_end(tag)  # most recently used last
        return self.episodes[tag]

    # -- one request -------------------------------------------------------------------------------
    def prepare(self, req: ChatRequest, tag: str | None) -> tuple[Job, EpisodeLog | None, list[int], list]:
        """Check the request, render it, build the engine work; errors are ``ApiError``s."""
        if req.model != self.model_name:
            raise ApiError(404, f"The model '{req.model}' does not exist; this server serves "
                           f"'{self.model_name}' (GET /v1/models).", "model", "model_not_found")
        if req.messages[-1].role == "assistant":
            raise ApiError(400, "messages: the last message is the assistant's; continuing an assistant message "
                           "is not supported — end with a user or tool message", "messages")
        if req.top_logprobs:
            raise ApiError(400, "top_logprobs > 0 is not supported (logprobs=true gives each sampled token's)",
                           "top_logprobs")
        log = self._log(tag)
        chained = self._chain(log, req.messages) if log else None
        try:
            if chained:
                base, rest = chained
                prompt = base.prompt_ids + base.ids + self.renderer.suffix_ids([m.as_chat() for m in rest])
            else:
                prompt = self.renderer.prompt_ids([self._as_text(m) for m in req.messages], req.tools)
        except (ValueError, TypeError, KeyError) as err:  # a template that refuses these messages
            raise ApiError(400, f"messages: cannot render them with this model's chat template: {err}",
                           "messages") from None
        room = self.max_len - len(prompt)
        limit = req.limit or min(self.default_max_tokens, room)
        base = chained[0] if chained else None
        start = base.start if base else len(prompt)
        if self.episode_budget is not None and log is not None:
            left = self.episode_budget - (len(prompt) - start)
            if left < 1:
                raise ApiError(400, f"this episode has used its token budget ({self.episode_budget} tokens after its "
                               "first prompt, sampled and inserted; rollout.max_new_tokens)", "max_tokens",
                               "episode_budget_exhausted")
            limit = min(req.limit or left, left)
        if limit > room or room < 1:
            raise ApiError(400, f"This model's maximum context length is {self.max_len} tokens. However, you "
                           f"requested {len(prompt) + max(limit, 1)} tokens ({len(prompt)} in the messages, "
                           f"{max(limit, 1)} in the completion). Please reduce the length of the messages or the "
                           "completion (max_tokens).", "max_tokens", "context_length_exceeded")
        return self._job(req, log, prompt, limit, base), log, (prompt, start), base

    def _job(self, req: ChatRequest, log: EpisodeLog | None, prompt: list[int], limit: int,
             base: Choice | None) -> Job:
        params = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=req.top_p or 1.0, max_new_tokens=limit, stop_token_ids=self.stop_ids,
                                keep_cache=log is not None and hasattr(self.engine, "resume") and req.n == 1)
        if self.sampling is not None:
            s = self.sampling
            params = replace(params, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        seeds = [self._seed(req, log, i) for i in range(req.n)]
        if base is not None and base.completion is not None and base.completion.kv is not None and req.n == 1:
            done, appended = base.completion, prompt[len(base.prompt_ids) + len(base.ids):]
            skip = len(done.token_ids) + len(appended)
            state = continuation(done, appended, params=replace(params, max_new_tokens=skip + limit),
                                 seed=seeds[0], version=self.engine.version)
            return Job([state], notify=None, stream=req.stream, stops=tuple(req.stop), skip=[skip])
        return Job([Request(list(prompt), replace(params, seed=s)) for s in seeds], notify=None, stream=req.stream,
                   stops=tuple(req.stop))

    def _seed(self, req: ChatRequest, log: EpisodeLog | None, choice: int) -> int:
        if req.seed is not None:
            return derive(req.seed, choice)
        if log is not None:
            return derive(*log.key, len(log.calls), *([choice] if choice else []))
        self._counter += 1
        return derive(self.seed, UNTAGGED, self._counter, choice)

    def _chain(self, log: EpisodeLog, messages: list[Message]) -> tuple[Choice, list[Message]] | None:
        """The recorded choice this conversation continues token-faithfully, and the messages after it."""
        keys = [m.key() for m in messages]
        for call in reversed(log.calls):
            n = len(call.keys)
            if len(keys) <= n + 1 or keys[:n] != call.keys or messages[n].role != "assistant":
                continue
            rest = messages[n + 1:]
            if any(m.role not in ("tool", "user") for m in rest):
                continue
            for choice in call.choices:
                if choice.ended and choice.key == keys[n]:
                    return choice, rest
        return None

    def _as_text(self, m: Message) -> dict:
        """A message for a fresh render: an assistant's tool calls written out in the tool format."""
        out = m.as_chat()
        calls = out.pop("tool_calls", None)
        if calls and m.role == "assistant":
            out["content"] = (out["content"] or "") + "".join(self.fmt.call_text(c["function"]["name"],
                                                                               c["function"]["arguments"])
                                                            for c in calls)
        return out

    # -- answering ---------------------------------------------------------------------------------
    async def complete(self, req: ChatRequest, tag: str | None = None) -> dict | AsyncIterator[str]:
        job, log, (prompt, start), base = self.prepare(req, tag)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job.notify = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
        if log is not None:
            log.jobs.append(job)
        self.driver.submit(job)
        if req.stream:
            return self._stream(req, job, log, (prompt, start), events)
        done: dict[int, Completion] = {}
        try:
            while len(done) < req.n:
                ev = await events.get()
                if ev[0] == "error":
                    raise ApiError(400, ev[1])
                if ev[0] == "done":
                    done[ev[1]] = ev[2]
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            if log is not None and job in log.jobs:
                log.jobs.remove(job)
        choices = [self._choice(req, prompt, job.skip[i], done[i], start) for i in range(req.n)]
        self._record(log, req, [c for c, _ in choices], base)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": sum(len(c.ids) for c, _ in choices)}
        return envelope("chat.completion", completion_id(), self.model_name, self.engine.version) | {
            "choices": [body | {"index": i} for i, (_, body) in enumerate(choices)],
            "usage": usage | {"total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}

    def _choice(self, req: ChatRequest, prompt: list[int], skip: int, c: Completion,
                start: int) -> tuple[Choice, dict]:
        """The recorded choice and OpenAI's ``choices[i]`` for a finished completion."""
        ids, lps, vs = c.token_ids[skip:], c.logprobs[skip:], c.versions[skip:]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for s in req.stop:
            text = text.split(s, 1)[0]
        message, finish = {"role": "assistant", "content": text}, "length" if c.finish_reason == "length" else "stop"
        # a turn cut by max_tokens makes no calls (an in-process episode's rule too)
        calls = [call for call in self.fmt.parse(text) if not call.error] \
            if req.parses_tools and c.finish_reason == "stop" else []
        if calls:
            head = text.split(self.fmt.open, 1)[0].strip()
            message = {"role": "assistant", "content": head or None, "tool_calls": [
                {"id": f"call_{completion_id()[9:]}", "type": "function",
                 "function": {"name": call.name, "arguments": json.dumps(self._arguments(req, call))}}
                for call in calls]}
            finish = "tool_calls"
        choice = Choice(prompt, ids, lps, vs, finish, Message(**message).key(),
                        ended=bool(ids) and ids[-1] in self.stop_ids, start=start, completion=c)
        body = {"message": message, "finish_reason": finish,
                "logprobs": token_logprobs(self._pieces(ids), lps) if req.logprobs else None}
        return choice, body

    def _arguments(self, req: ChatRequest, call) -> dict:
        """A call's arguments as an object; positional ones (the plain format's) named by the tool's schema."""
        if not call.positional:
            return dict(call.arguments)
        schema = next((t["function"] for t in req.tools or [] if t["function"]["name"] == call.name), {})
        names = list((schema.get("parameters") or {}).get("properties", {}))
        named = {names[i] if i < len(names) else f"arg{i}": v for i, v in enumerate(call.positional)}
        return named | dict(call.arguments)

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([t]) for t in ids]

    def _record(self, log: EpisodeLog | None, req: ChatRequest, choices: list[Choice], base: Choice | None) -> None:
        if log is None:
            return
        if base is not None:
            base.completion = None  # its cache now lives in the continuation
        for call in log.calls:  # only the latest call's caches are worth keeping
            for c in call.choices:
                c.completion = None if c.completion is None else replace(c.completion, kv=None)
        log.calls.append(Call([m.key() for m in req.messages], choices, [m.as_chat() for m in req.messages]))
        cached = [lg for lg in self.episodes.values() if lg.calls and any(
            c.completion is not None and c.completion.kv is not None for c in lg.calls[-1].choices)]
        for old in cached[: max(0, len(cached) - self.max_cached)]:  # least recently used first
            for c in old.calls[-1].choices:
                c.completion = None if c.completion is None else replace(c.completion, kv=None)

    async def _stream(self, req: ChatRequest, job: Job, log: EpisodeLog | None, prompt_start: tuple[list[int], int],
                      events: asyncio.Queue) -> AsyncIterator[str]:
        """Server-sent events: a role chunk, content deltas as tokens are sampled (with tools: the
        message when the choice finishes), a finish chunk per choice, usage if asked, ``[DONE]``."""
        (prompt, start), cid = prompt_start, completion_id()
        head = envelope("chat.completion.chunk", cid, self.model_name, self.engine.version)
        texts, done, recorded = [""] * req.n, 0, []
        try:
            for i in range(req.n):
                yield _sse(head | {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}]})
            streamed: list[list[int]] = [[] for _ in range(req.n)]
            while done < req.n:
                ev = await events.get()
                if ev[0] == "error":
                    yield _sse(ApiError(400, ev[1]).body())
                    return
                i = ev[1]
                if ev[0] == "delta":
                    streamed[i] += ev[2]
                    text = self.tokenizer.decode(streamed[i], skip_special_tokens=True)
                    for s in req.stop:
                        text = text.split(s, 1)[0]
                    text = text[:len(text) - _stop_start(text, req.stop)]  # may yet be a stop string: wait
                    if req.parses_tools or text.endswith("\ufffd") or len(text) <= len(texts[i]):
                        continue  # tools: the message is sent whole at the end; a cut character waits
                    delta, texts[i] = text[len(texts[i]):], text
                    chunk = {"index": i, "delta": {"content": delta}, "finish_reason": None}
                    if req.logprobs:
                        chunk["logprobs"] = token_logprobs(self._pieces(ev[2]), ev[3])
                    yield _sse(head | {"choices": [chunk]})
                elif ev[0] == "done":
                    choice, body = self._choice(req, prompt, job.skip[i], ev[2], start)
                    recorded.append((i, choice))
                    rest = body["message"].get("content") or ""
                    delta = {"content": rest[len(texts[i]):]} if rest[len(texts[i]):] else {}
                    if body["message"].get("tool_calls"):
                        delta["tool_calls"] = [c | {"index": k} for k, c in enumerate(body["message"]["tool_calls"])]
                    yield _sse(head | {"choices": [{"index": i, "delta": delta, "finish_reason": body["finish_reason"]}]})
                    done += 1
            self._record(log, req, [c for _, c in sorted(recorded, key=lambda x: x[0])], None)
            if req.stream_options and req.stream_options.include_usage:
                n_out = sum(len(c.ids) for _, c in recorded)
                yield _sse(head | {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                                                            "total_tokens": len(prompt) + n_out}})
            yield "data: [DONE]\n\n"
        finally:
            if done < req.n:
                job.cancel()
            if log is not None and job in log.jobs:
                log.jobs.remove(job)


def _stop_start(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` begin a stop string (streamed only once they do not).

    >>> _stop_start("ab<ca", ["<call>"]), _stop_start("abc", ["<call>"])
    (3, 0)
    """
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
