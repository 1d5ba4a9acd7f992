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

Seeds: an episode a training run opened (``open(tag, key)``: step seed, prompt slot, sample)
samples its call k with ``derive(*key, k)`` — an in-process episode's turn k — whatever ``seed``
the request names, so a run's harness calls sample the same tokens every run and the episodes of
a group differ. Elsewhere a request's ``seed``, else the tag's key and the call's index, else
the service's seed and a counter. A call's index is taken when it starts (concurrent calls on one
tag never share one). Budgets and memory caps: ``serve/episodes.py`` (``Episodes``) and ``ChatService``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from rollwise.engine.engine import Completion, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import continuation
from rollwise.generate.conversation import ChatRenderer
from rollwise.seeds import derive
from rollwise.serve.driver import EngineDriver, Job
from rollwise.serve.episodes import Call, Choice, EpisodeLog, Episodes, Ticket, drop_kv, kv_bytes
from rollwise.serve.schema import (ApiError, ChatRequest, Message, completion_id, envelope, token_logprobs)

__all__ = ["ChatService", "Call", "Choice", "EpisodeLog", "Episodes"]

UNTAGGED = 2  # seed-derivation key of untagged requests (episodes.TAGGED is 1)
CHARS_PER_TOKEN = 100  # more than any vocabulary's tokens average: past max_len × this, text cannot fit


@dataclass
class Work:
    """One accepted request: its engine job and what it will record."""

    job: Job
    log: EpisodeLog | None
    prompt: list[int]
    start: int  # length of the first prompt of the chain it continues
    base: Choice | None  # the recorded choice it continues
    ticket: Ticket | None  # what it reserved of its episode's budgets
    inserted: int = 0  # ids between the continued choice and this prompt's end (tool results, user turns)


class ChatService:
    """Requests in, OpenAI answers out; records tagged calls (module docstring).

    Caps (``None`` = none): ``max_len`` bounds prompt + max_tokens (``--max-model-len``: the slot
    engine's cache grows to the longest request and stays); ``kv_cache_mb`` and ``max_cached`` the
    kept episode caches; ``max_calls`` and ``max_tag_tokens`` (ids recorded: prompts and completions)
    each tag; ``max_recorded_tokens`` all tags a server opened itself (least recently used forgotten
    first); a training run's ``episode_budget`` (tokens sampled + inserted per episode),
    ``max_segments`` and ``max_n``. ``open_tags_only``: only tags ``episodes.open`` made are served (a
    training run's endpoint: nobody else's calls are recorded and trained).
    """

    def __init__(self, driver: EngineDriver, tokenizer, fmt, *, model_name: str, max_len: int, seed: int = 0,
                 default_max_tokens: int = 512, max_episodes: int = 4096, max_cached: int = 256,
                 sampling: SamplingParams | None = None, episode_budget: int | None = None,
                 kv_cache_mb: float = 1024.0, max_calls: int | None = 1024, max_tag_tokens: int | None = 1 << 20,
                 max_recorded_tokens: int = 1 << 23, max_n: int | None = None, max_segments: int | None = None,
                 open_tags_only: bool = False):
        self.driver, self.tokenizer, self.fmt = driver, tokenizer, fmt
        self.renderer = ChatRenderer(tokenizer, fmt)
        self.model_name, self.max_len, self.seed = model_name, max_len, seed
        self.default_max_tokens = default_max_tokens
        self.max_calls, self.max_tag_tokens = max_calls, max_tag_tokens
        # a training run's settings: temperature, top-p and top-k are the run's whatever a request asks (the
        # update recomputes log-probs under them); an episode's sampled and inserted tokens, its segments and
        # a call's choices are capped
        self.sampling, self.episode_budget = sampling, episode_budget
        self.max_n, self.max_segments = max_n, max_segments
        # the recorded tags (a training run opens and closes its own: service.episodes.open(tag, key), .close(tag))
        self.episodes = Episodes(seed, max_episodes=max_episodes, max_cached=max_cached, kv_cache_mb=kv_cache_mb,
                                 max_recorded_tokens=max_recorded_tokens, open_tags_only=open_tags_only)
        self.stop_ids = tuple(t for t in {tokenizer.eos_token_id} if t is not None)
        self._counter = 0

    @property
    def engine(self):
        return self.driver.engine

    # -- one request -------------------------------------------------------------------------------
    def prepare(self, req: ChatRequest, tag: str | None) -> Work:
        """Check the request, render it, reserve its episode's budgets, build the engine work; errors
        are ``ApiError``s."""
        self._check(req)
        log = None if tag is None else self.episodes.touch(tag)
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
        base = chained[0] if chained else None
        inserted = len(prompt) - len(base.prompt_ids) - len(base.ids) if base else 0
        room = self.max_len - len(prompt)
        limit = req.limit or min(self.default_max_tokens, room)
        # every choice of a fresh render starts a chain (a segment); a continuation's first extends its chain
        segments = req.n - (base is not None)
        if log is not None:
            limit = self._allowance(req, log, len(prompt), limit, inserted, segments)
        if limit > room or room < 1:
            raise ApiError(400, f"This model's maximum context length is {self.max_len} tokens. However, you "
                           f"requested {len(prompt) + max(limit, 1)} tokens ({len(prompt)} in the messages, "
                           f"{max(limit, 1)} in the completion). Please reduce the length of the messages or the "
                           "completion (max_tokens).", "max_tokens", "context_length_exceeded")
        ticket = None
        if log is not None:
            ticket = Ticket(log.started, inserted + req.n * limit, segments, req.n * (len(prompt) + limit))
            log.started += 1
            log.reserve(ticket)
        job = self._job(req, log, ticket, prompt, limit, base)
        return Work(job, log, prompt, base.start if base else len(prompt), base, ticket, inserted)

    def _check(self, req: ChatRequest) -> None:
        if req.model != self.model_name:
            raise ApiError(404, f"The model '{req.model}' does not exist; this server serves "
                           f"'{self.model_name}' (GET /v1/models).", "model", "model_not_found")
        if req.messages[-1].role == "assistant":
            raise ApiError(400, "messages: the last message is the assistant's; continuing an assistant message "
                           "is not supported — end with a user or tool message", "messages")
        if req.top_logprobs:
            raise ApiError(400, "top_logprobs > 0 is not supported (logprobs=true gives each sampled token's)",
                           "top_logprobs")
        if self.max_n is not None and req.n > self.max_n:
            raise ApiError(400, f"n: at most {self.max_n} choices per call here (asked {req.n})", "n")
        chars = sum(len(m.text) + len(str(m.tool_calls or "")) for m in req.messages) + len(str(req.tools or ""))
        if chars > self.max_len * CHARS_PER_TOKEN:  # refused before tokenizing: a 2 MB message held ~150 MB there
            raise ApiError(400, f"This model's maximum context length is {self.max_len} tokens; the messages hold "
                           f"{chars} characters, more than any tokenizer fits in it. Please shorten them.",
                           "messages", "context_length_exceeded")

    def _allowance(self, req: ChatRequest, log: EpisodeLog, prompt_len: int, limit: int, inserted: int,
                   segments: int) -> int:
        """The call's max_tokens within its episode's caps (what calls in flight reserved counts);
        past one, ``episode_budget_exhausted`` (a harness's episode ends there)."""
        if self.max_calls is not None and log.started >= self.max_calls:
            raise _exhausted(f"this episode has made its {self.max_calls} calls")
        if self.max_segments is not None and log.segments + segments > self.max_segments:
            raise _exhausted(f"this episode has started {log.segments} of its {self.max_segments} segments (a call "
                             f"that does not continue a returned choice, and each extra choice, starts one)")
        if self.episode_budget is not None:
            each = (self.episode_budget - log.tokens - inserted) // req.n
            if each < 1:
                raise _exhausted(f"this episode has used its token budget ({self.episode_budget} tokens sampled "
                                 "and inserted, over all its calls and choices; rollout.max_new_tokens)")
            limit = min(req.limit or each, each)
        if self.max_tag_tokens is not None and log.recorded + req.n * (prompt_len + limit) > self.max_tag_tokens:
            raise _exhausted(f"this episode would record more than {self.max_tag_tokens} ids (prompts and "
                             "completions): end it (DELETE /episodes/{tag}) and start another")
        return limit

    def _job(self, req: ChatRequest, log: EpisodeLog | None, ticket: Ticket | None, prompt: list[int], limit: int,
             base: Choice | None) -> Job:
        params = SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                                top_p=req.top_p or 1.0, max_new_tokens=limit, stop_token_ids=self.stop_ids,
                                keep_cache=log is not None and hasattr(self.engine, "resume") and req.n == 1)
        if self.sampling is not None:
            s = self.sampling
            params = replace(params, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        seeds = [self._seed(req, log, ticket.index if ticket else 0, i) for i in range(req.n)]
        if base is not None and base.completion is not None and base.completion.kv is not None and req.n == 1:
            done, appended = base.completion, prompt[len(base.prompt_ids) + len(base.ids):]
            skip = len(done.token_ids) + len(appended)
            state = continuation(done, appended, params=replace(params, max_new_tokens=skip + limit),
                                 seed=seeds[0], version=self.engine.version)
            return Job([state], notify=None, stream=req.stream, stops=tuple(req.stop), skip=[skip])
        return Job([Request(list(prompt), replace(params, seed=s)) for s in seeds], notify=None, stream=req.stream,
                   stops=tuple(req.stop))

    def _seed(self, req: ChatRequest, log: EpisodeLog | None, index: int, choice: int) -> int:
        # a training run's episode: its key and the call's index, whatever the request asks (a harness that
        # passes seed=1234 would otherwise give every episode of a group the same tokens)
        if log is not None and (log.run or req.seed is None):
            return derive(*log.key, index, *([choice] if choice else []))
        if req.seed is not None:
            return derive(req.seed, choice)
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
        work = self.prepare(req, tag)
        job, log = work.job, work.log
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        job.notify = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
        if log is not None:
            log.jobs.append(job)
        self.driver.submit(job)
        if req.stream:
            return self._stream(req, work, events)
        done: dict[int, Completion] = {}
        try:
            while len(done) < req.n:
                ev = await events.get()
                if ev[0] == "error":
                    raise _failed(ev)
                if ev[0] == "done":
                    done[ev[1]] = ev[2]
        except BaseException:  # an engine error, a client gone (cancelled): nothing is recorded
            job.cancel()
            self._release(work)
            raise
        finally:
            if log is not None and job in log.jobs:
                log.jobs.remove(job)
        choices = [self._choice(req, work.prompt, job.skip[i], done[i], work.start) for i in range(req.n)]
        self._record(work, req, [c for c, _ in choices])
        usage = {"prompt_tokens": len(work.prompt), "completion_tokens": sum(len(c.ids) for c, _ in choices)}
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

    def _release(self, work: Work) -> None:
        if work.log is not None and work.ticket is not None:
            work.log.release(work.ticket)

    def _record(self, work: Work, req: ChatRequest, choices: list[Choice]) -> None:
        log = work.log
        if log is None:
            return
        if work.base is not None:
            work.base.completion = None  # its cache now lives in the continuation
        for call in log.calls:  # only the latest call's caches are worth keeping
            drop_kv(call)
        call = Call([m.key() for m in req.messages], choices, [m.as_chat() for m in req.messages], work.ticket.index)
        log.add(call, work.ticket, work.inserted)
        log.kv = kv_bytes(call)
        self.episodes.bound(log)

    async def _stream(self, req: ChatRequest, work: Work, events: asyncio.Queue) -> AsyncIterator[str]:
        """Server-sent events: a role chunk, content deltas as tokens are sampled (with tools: the
        message when the choice finishes), a finish chunk per choice, usage if asked, ``[DONE]``."""
        job, log, prompt, cid = work.job, work.log, work.prompt, completion_id()
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
                    yield _sse(_failed(ev).body())
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
                    choice, body = self._choice(req, prompt, job.skip[i], ev[2], work.start)
                    recorded.append((i, choice))
                    rest = body["message"].get("content") or ""
                    delta = {"content": rest[len(texts[i]):]} if rest[len(texts[i]):] else {}
                    if body["message"].get("tool_calls"):
                        delta["tool_calls"] = [c | {"index": k} for k, c in enumerate(body["message"]["tool_calls"])]
                    yield _sse(head | {"choices": [{"index": i, "delta": delta, "finish_reason": body["finish_reason"]}]})
                    done += 1
            self._record(work, req, [c for _, c in sorted(recorded, key=lambda x: x[0])])
            if req.stream_options and req.stream_options.include_usage:
                n_out = sum(len(c.ids) for _, c in recorded)
                yield _sse(head | {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_out,
                                                            "total_tokens": len(prompt) + n_out}})
            yield "data: [DONE]\n\n"
        finally:
            if done < req.n:  # a client gone, an engine error: nothing is recorded
                job.cancel()
                self._release(work)
            if log is not None and job in log.jobs:
                log.jobs.remove(job)


def _stop_start(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` begin a stop string (streamed only once they do not).

    >>> _stop_start("ab<ca", ["<call>"]), _stop_start("abc", ["<call>"])
    (3, 0)
    """
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def _exhausted(why: str) -> ApiError:
    return ApiError(400, why, "max_tokens", "episode_budget_exhausted")


def _failed(event: tuple) -> ApiError:
    """A driver's ``("error", message[, status])`` event as the request's error."""
    status = event[2] if len(event) > 2 else 400
    return ApiError(status, event[1], kind="server_error" if status >= 500 else "invalid_request_error")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"
