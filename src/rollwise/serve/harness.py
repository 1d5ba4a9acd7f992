"""Harness rollouts (``rollout.harness``): an agent program that only knows the OpenAI client,
trained token-faithfully.

The harness is ``async def rollout(client, row) -> float | None`` (``package.module:function``),
ART's shape: ``client`` is an ``openai.AsyncOpenAI`` whose base URL is this episode's
(``/episodes/{tag}/v1`` on the run's endpoint, ``serve/app.py``), ``row`` the dataset row
(``prompt`` = the prompt text, ``messages`` = the prompt as chat messages, and every column the
task's reward functions get). It calls ``client.chat.completions.create(model=row["model"], ...)``
as often as it likes; the endpoint records every call (prompt ids, sampled ids, behaviour
log-probs, policy versions: ``serve/service.py``). The float it returns is the reward
component ``environment`` (added to the task's reward functions, which score the final
assistant message; ``None`` = only those).

Rebuilding the trajectory (METHODS ``token_faithful``): calls are taken in order; a call whose
prompt ids start with an earlier segment's prompt + completion ids extends that segment (the ids
between are inserted: loss weight 0, log-prob 0), else it starts a new segment. The first
segment is the episode's ``Rollout``; the others ride along as ``Rollout.segments`` and train
with the episode's advantage. Only sampled ids are trained.

A harness that raises, or runs past ``rollout.harness_timeout`` seconds, scores 0 with the
reason (``reward_reasons["harness"]``); its unfinished requests are aborted, and its record is
dropped when the episode ends, so nothing leaks into the next. Sampling settings are the run's
(``rollout.temperature``/``top_p``/``top_k``: the update recomputes log-probs under them) whatever
the harness asks; ``rollout.max_new_tokens`` bounds an episode's tokens after its first prompt.

Departures: ART and verifiers also merge calls whose prompts differ only in re-tokenization;
here such a call starts a new segment (never re-tokenized). An episode's segments count once in
its group's statistics (their shared reward), not once per segment.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
import threading
from dataclasses import dataclass, field

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.serve.service import EpisodeLog
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn

MODEL_NAME = "policy"  # the model id a harness asks for (row["model"])


def load_harness(spec: str):
    """``rollout.harness`` → the ``async def rollout(client, row)`` it names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"rollout.harness: {spec!r} is not 'package.module:function'")
    if "" not in sys.path and os.getcwd() not in sys.path:  # like `python -m`: modules beside the run
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"rollout.harness: cannot import module {module_name!r} ({err})") from None
    fn = getattr(module, attr, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"rollout.harness: {spec!r} must be an `async def {attr}(client, row)` "
                          "(it gets an openai.AsyncOpenAI client and the dataset row)")
    return fn


@dataclass
class Segment:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    finish: str = "stop"

    @property
    def full(self) -> list[int]:
        return self.prompt_ids + self.ids


def segments_of(log: EpisodeLog) -> list[Segment]:
    """The episode's calls as token-faithful segments (see the module docstring)."""
    segments: list[Segment] = []
    for call in log.calls:
        for choice in call.choices:
            seg = next((s for s in reversed(segments) if choice.prompt_ids[: len(s.full)] == s.full), None)
            if seg is None:
                seg = Segment(list(choice.prompt_ids))
                segments.append(seg)
            inserted = choice.prompt_ids[len(seg.full):]
            seg.ids += inserted + choice.ids
            seg.logprobs += [0.0] * len(inserted) + choice.logprobs
            last = seg.versions[-1] if seg.versions else (choice.versions[0] if choice.versions else 0)
            seg.versions += [last] * len(inserted) + choice.versions
            seg.weights += [0] * len(inserted) + [1] * len(choice.ids)
            seg.turns.append(Turn(len(seg.ids) - len(choice.ids), len(seg.ids)))
            seg.finish = "length" if choice.finish_reason == "length" else "stop"
    return segments


@dataclass
class HarnessSampler(Generator):
    """Episodes run by ``harness`` against the run's endpoint (started on first use, on 127.0.0.1)."""

    params: SamplingParams
    tokenizer: object
    fmt: object
    harness: object  # async def rollout(client, row) -> float | None
    timeout: float = 300.0
    _server: object = field(default=None, repr=False)

    def generate(self, engine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        server = self._serve(engine)
        server.service.sampling = self.params  # this call's settings (an eval passes greedy ones)
        server.service.episode_budget = self.params.max_new_tokens
        server.service.stop_ids = self.params.stop_token_ids or server.service.stop_ids
        episodes = [(pi, f"{seed}-{pi}-{j}", (seed, pi, j)) for pi, n in enumerate(budgets) for j in range(n)]
        for _, tag, key in episodes:  # call k samples as an in-process episode's turn k (EpisodeSampler's seeds)
            server.service.open(tag, key)
        outcomes: dict[str, tuple[float | None, str]] = {}
        finished = threading.Event()

        def run() -> None:
            try:
                outcomes.update(asyncio.run(self._run_all(server, prompts, episodes)))
            finally:
                finished.set()

        thread = threading.Thread(target=run, name="rollwise-harness", daemon=True)
        thread.start()
        server.drive(finished.is_set)
        thread.join()
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        counts = {"calls": 0, "segments": 0, "failed": 0}
        for pi, tag, _ in episodes:
            log = server.service.close(tag)
            reward, reason = outcomes.get(tag, (None, "the harness did not finish"))
            rollout = self._rollout(prompts[pi], log, reward, reason)
            counts["calls"] += len(log.calls) if log else 0
            counts["segments"] += 1 + len(rollout.segments or [])
            counts["failed"] += bool(reason)
            groups[pi].rollouts.append(rollout)
        n = max(len(episodes), 1)
        return groups, {"harness/calls_mean": counts["calls"] / n, "harness/segments_mean": counts["segments"] / n,
                        "harness/failed": counts["failed"] / n}

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _serve(self, engine):
        if self._server is None or self._server.service.engine is not engine:
            from rollwise.serve.app import serve_engine

            self.close()
            self._server = serve_engine(engine, self.tokenizer, self.fmt, model_name=MODEL_NAME,
                                        default_max_tokens=self.params.max_new_tokens)
        return self._server

    async def _run_all(self, server, prompts: list[Prompt], episodes) -> dict[str, tuple[float | None, str]]:
        import openai

        # one connection pool for every episode's client (a client of its own builds an SSL context: ~25 ms each)
        async with openai.DefaultAsyncHttpxClient(timeout=self.timeout) as http:
            results = await asyncio.gather(*(self._episode(server, prompts[pi], tag, http) for pi, tag, _ in episodes))
        return {tag: r for (_, tag, _), r in zip(episodes, results)}

    async def _episode(self, server, prompt: Prompt, tag: str, http) -> tuple[float | None, str]:
        """Run the harness on one episode: (its reward, "") or (None, why it failed)."""
        import openai

        row = {**prompt.reward_columns(), "prompt": prompt.text, "model": MODEL_NAME,
               "messages": [dict(m) for m in prompt.messages or [{"role": "user", "content": prompt.text}]]}
        client = openai.AsyncOpenAI(base_url=server.episode_url(tag), api_key="rollwise", max_retries=0,
                                    timeout=self.timeout, http_client=http)
        try:
            reward = await asyncio.wait_for(self.harness(client, row), self.timeout)
        except openai.BadRequestError as err:
            if getattr(err, "code", None) == "episode_budget_exhausted":  # the episode ran out of tokens: it ends
                return None, ""
            server.service.cancel(tag)
            return None, f"the harness raised {type(err).__name__}: {err}"[:500]
        except asyncio.TimeoutError:
            server.service.cancel(tag)
            return None, f"the harness ran past rollout.harness_timeout ({self.timeout:g} s)"
        except Exception as err:  # a harness must not take training down
            server.service.cancel(tag)
            return None, f"the harness raised {type(err).__name__}: {err}"[:500]
        if reward is not None and not isinstance(reward, (int, float)):
            return None, f"the harness returned {type(reward).__name__}, not a float or None"
        return (None if reward is None else float(reward)), ""

    def _rollout(self, prompt: Prompt, log: EpisodeLog | None, reward: float | None, reason: str) -> Rollout:
        segments = segments_of(log) if log else []
        rollouts = [self._segment_rollout(prompt, s) for s in segments]
        if not rollouts:  # no model call: an empty completion that scores 0
            ids = list(self.tokenizer(prompt.text)["input_ids"])
            rollouts = [Rollout(prompt.id, ids, [], [], [], "stop")]
            reason = reason or "the harness made no model call"
        main = rollouts[-1]  # the last segment: what the final answer is read from
        main.segments = rollouts[:-1] or None
        main.messages = _messages(log, main.completion_text) if log and log.calls else None
        main.env_reward = None if reason else reward
        main.failure = reason or None
        return main

    def _segment_rollout(self, prompt: Prompt, s: Segment) -> Rollout:
        return Rollout(prompt_id=prompt.id, prompt_ids=s.prompt_ids, completion_ids=s.ids,
                       behavior_logprobs=s.logprobs, versions=s.versions, finish_reason=s.finish,
                       completion_text=self.tokenizer.decode(s.ids, skip_special_tokens=True),
                       loss_weights=s.weights if 0 in s.weights else None, turns=s.turns)


def _messages(log: EpisodeLog, final_text: str) -> list[dict]:
    """The episode as TRL's conversational completion: the last call's messages after its first
    system/user ones, and the last assistant message."""
    last = log.calls[-1]
    first = next((i for i, m in enumerate(last.messages) if m["role"] not in ("system", "user")), len(last.messages))
    return [*last.messages[first:], {"role": "assistant", "content": final_text}]
