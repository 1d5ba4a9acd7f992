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
assistant turn; ``None`` = only those). Its module may declare ``TOOLS``, the schemas its calls send:
SFT renders tool demonstrations with them, as the endpoint renders its calls (``declared_tools``).

Rebuilding the trajectory (METHODS ``token_faithful``): calls are taken in order; a call whose
prompt ids start with an earlier segment's prompt + completion ids extends that segment (the ids
between are inserted: loss weight 0, log-prob 0), else it starts a new segment. The **main**
segment is the one holding the final call's returned choice (with ``n`` > 1 the harness's pick
is unknowable: choice 0); it is the episode's ``Rollout``, whose ``messages`` end with that
choice's turn (``{"role": "assistant", "content": its decoded ids}``, also its
``completion_text``: what a verifier reads). The other segments ride along as
``Rollout.segments`` and train with the episode's advantage. Only sampled ids are trained.

Guaranteed, whatever the harness does (``serve/harness_proc.py``): it runs in a worker process of
its own, so a blocked event loop cannot stall the engine; an episode that raises, returns
something other than a float or None, or runs past ``rollout.harness_timeout`` (the parent's
clock: a worker that does not answer is killed and restarted) scores 0 with the reason
(``Rollout.failure``), counted in ``harness/failed``; its unfinished requests are aborted in the
engine before ``generate`` returns, and its record is dropped. Sampling settings are the run's
(``rollout.temperature``/``top_p``/``top_k``: the update recomputes log-probs under them) whatever
the harness asks; an episode samples (and inserts) at most ``rollout.max_new_tokens`` tokens over
all its calls, segments and choices, and starts at most ``max_segments`` segments; a call past
either ends the episode (not a failure). The endpoint answers only this run's open episodes and
its per-run key (the harness's client sends it).

Endpoints: one per engine the sampler generates with (a training run's, and in async mode the
producer's), shared by the sampler's copies (an eval's ``replace``) and closed by ``close()``
only: an eval never closes another engine's endpoint.

Departures: ART and verifiers also merge calls whose prompts differ only in re-tokenization;
here such a call starts a new segment (never re-tokenized). An episode's segments count once in
its group's statistics (their shared reward), not once per segment.
"""

from __future__ import annotations

import pickle
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator
from rollwise.serve.harness_proc import HarnessWorker, import_harness, spec_of
from rollwise.serve.service import EpisodeLog
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn

MODEL_NAME = "policy"  # the model id a harness asks for (row["model"])


def load_harness(spec: str):
    """``rollout.harness`` → the ``async def rollout(client, row)`` it names (imported here to check it;
    the worker process imports it again by the same spec)."""
    from rollwise.imports import import_spec

    if ":" in spec:  # the working directory and the recipe's are importable (on sys.path for the worker process)
        import_spec(spec, "rollout.harness", what="function")
    try:
        return import_harness(spec)
    except ValueError as err:
        raise ConfigError(f"rollout.harness: {err}") from None


@dataclass
class Segment:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    finish: str = "stop"
    final: Turn | None = None  # the final call's returned choice (choice 0), when this segment holds it

    @property
    def full(self) -> list[int]:
        return self.prompt_ids + self.ids


def segments_of(log: EpisodeLog) -> list[Segment]:
    """The episode's calls as token-faithful segments (see the module docstring)."""
    segments: list[Segment] = []
    for ci, call in enumerate(log.calls):
        for k, choice in enumerate(call.choices):
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
            if ci == len(log.calls) - 1 and k == 0:
                seg.final = seg.turns[-1]
    return segments


@dataclass
class Endpoint:
    """One engine's endpoint and the harness process that talks to it (one batch of episodes at a time)."""

    server: object
    worker: HarnessWorker
    lock: threading.Lock = field(default_factory=threading.Lock)


class Endpoints:
    """A sampler's endpoints, one per engine; its copies share this object (``dataclasses.replace``
    copies the reference), so an eval's copy finds — never replaces or closes — the producer's.

    At most ``keep`` are kept (a run's engine, and in async mode its producer's): a new one closes
    the least recently used idle ones (a stopped producer's engine is not served for good). After
    ``close()`` none starts again (a producer thread still running gets an error, not a new server)."""

    def __init__(self, keep: int = 2):
        self._made: list[tuple[object, Endpoint]] = []  # least recently used first
        self._lock = threading.Lock()
        self.keep, self.closed = keep, False

    def get(self, engine, make) -> Endpoint:
        with self._lock:
            if self.closed:
                raise RuntimeError("the harness sampler is closed: its endpoints are stopped")
            found = next(((e, ep) for e, ep in self._made if e is engine), None)
            if found is None:
                found = (engine, make(engine))
                self._retire(len(self._made) + 1 - self.keep)
            else:
                self._made.remove(found)
            self._made.append(found)
            return found[1]

    def _retire(self, n: int) -> None:
        """Close up to ``n`` of the least recently used endpoints no batch is running on."""
        for item in list(self._made):
            if n <= 0:
                return
            if item[1].lock.acquire(blocking=False):
                self._made.remove(item)
                _stop(item[1])
                item[1].lock.release()
                n -= 1

    def close(self) -> None:
        with self._lock:
            made, self._made, self.closed = self._made, [], True
        for _, endpoint in made:
            _stop(endpoint)


def _stop(endpoint: Endpoint) -> None:
    endpoint.worker.kill()
    endpoint.server.close()


@dataclass
class HarnessSampler(Generator):
    """Episodes run by ``harness`` against the run's endpoints (started on first use, on 127.0.0.1)."""

    params: SamplingParams
    tokenizer: object
    fmt: object
    harness: object  # async def rollout(client, row) -> float | None, or its "package.module:function"
    timeout: float = 300.0
    max_segments: int = 16  # segments (fresh conversations, extra choices) an episode may start
    endpoints: Endpoints = field(default_factory=Endpoints, repr=False, compare=False)
    # the run's key: the endpoints answer only clients that send it (and only the episodes the run opened)
    api_key: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False, compare=False)

    def __post_init__(self):
        try:
            self.spec = spec_of(self.harness)
        except ValueError as err:
            raise ConfigError(f"rollout.harness: {err}") from None

    def generate(self, engine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        endpoint = self.endpoints.get(engine, self._start)
        with endpoint.lock:  # one batch at a time per engine
            return self._generate(endpoint, prompts, budgets, seed)

    def declared_tools(self) -> list[dict]:
        """The tools the harness's calls send, as its module declares them (``TOOLS``; none: []): SFT
        renders tool demonstrations with them (``train/sft.py``), as the endpoint renders its calls."""
        fn = self.harness if callable(self.harness) else import_harness(self.spec)
        return list(getattr(sys.modules.get(fn.__module__), "TOOLS", None) or [])

    def server(self, engine):
        """The endpoint serving ``engine`` (started if it is not yet)."""
        return self.endpoints.get(engine, self._start).server

    def close(self) -> None:
        """Stop every endpoint and harness process this sampler (or a copy of it) started."""
        self.endpoints.close()

    def _start(self, engine) -> Endpoint:
        from rollwise.serve.app import serve_engine

        server = serve_engine(engine, self.tokenizer, self.fmt, model_name=MODEL_NAME, api_key=self.api_key,
                              default_max_tokens=self.params.max_new_tokens, open_tags_only=True)
        return Endpoint(server, HarnessWorker(self.spec))

    def _generate(self, endpoint: Endpoint, prompts: list[Prompt], budgets: list[int],
                  seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        service = endpoint.server.service
        service.sampling = self.params  # this call's settings (an eval passes greedy ones)
        service.episode_budget = self.params.max_new_tokens
        service.max_segments = service.max_n = self.max_segments
        service.stop_ids = self.params.stop_token_ids or service.stop_ids
        episodes = [(pi, f"{seed}-{pi}-{j}", (seed, pi, j)) for pi, n in enumerate(budgets) for j in range(n)]
        for _, tag, key in episodes:  # call k samples as an in-process episode's turn k (EpisodeSampler's seeds)
            service.episodes.open(tag, key)
        jobs = [(tag, endpoint.server.episode_url(tag), _row(prompts[pi])) for pi, tag, _ in episodes]
        try:
            outcomes, killed = self._run(endpoint, jobs)
        finally:
            logs = {tag: service.episodes.close(tag) for _, tag, _ in episodes}
            _drain(endpoint.server)  # the closed episodes' unfinished requests are aborted now, not at the next step
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        counts = {"calls": 0, "segments": 0, "failed": 0}
        for pi, tag, _ in episodes:
            reward, reason = outcomes.get(tag, (None, "the harness did not finish"))
            rollout = self._rollout(prompts[pi], logs[tag], reward, reason)
            counts["calls"] += len(logs[tag].calls) if logs[tag] else 0
            counts["segments"] += 1 + len(rollout.segments or [])
            counts["failed"] += bool(reason)
            groups[pi].rollouts.append(rollout)
        n = max(len(episodes), 1)
        return groups, {"harness/calls_mean": counts["calls"] / n, "harness/segments_mean": counts["segments"] / n,
                        "harness/failed": counts["failed"] / n, "harness/restarts": float(killed)}

    def _run(self, endpoint: Endpoint, jobs: list[tuple[str, str, bytes]]) -> tuple[dict, bool]:
        """Run the episodes in the harness process while this thread drives the engine; end them at
        the timeout from here when the process does not (then it is killed: restarted next time).
        Returns each tag's (reward, failure reason) and whether the process was killed."""
        service, worker, outcomes = endpoint.server.service, endpoint.worker, {}
        if not jobs:
            return outcomes, False
        first = worker.starts == 0
        try:
            worker.submit(jobs, self.timeout, self.api_key)
        except RuntimeError as err:  # the process did not start
            if first:
                raise ConfigError(f"rollout.harness: {err}") from None
            return {tag: (None, str(err)[:500]) for tag, _, _ in jobs}, True
        deadline = time.monotonic() + self.timeout + _grace(self.timeout)
        killed = False

        def done() -> bool:  # called by the driver between engine steps (and every 20 ms while idle)
            nonlocal killed
            results, ended = worker.results()
            for tag, reward, reason in results:
                outcomes[tag] = (reward, reason)
                if reason:
                    service.episodes.cancel(tag, reason)
            if len(outcomes) == len(jobs):
                return True
            if ended or time.monotonic() > deadline:
                worker.kill(wait=2.0 if ended else 0.0)
                killed = True
                why = (f"the harness process exited (code {worker.returncode})" if ended else
                       f"the harness ran past rollout.harness_timeout ({self.timeout:g} s) and its process did "
                       "not answer (a blocked event loop?): killed, a new one serves the next step")
                for tag, _, _ in jobs:
                    if tag not in outcomes:
                        outcomes[tag] = (None, why)
                        service.episodes.cancel(tag, why)
                return True
            return False

        endpoint.server.drive(done)
        return outcomes, killed

    def _rollout(self, prompt: Prompt, log: EpisodeLog | None, reward: float | None, reason: str) -> Rollout:
        segments = segments_of(log) if log else []
        if not segments:  # no model call: an empty completion that scores 0
            ids = list(self.tokenizer(prompt.text)["input_ids"])
            main = Rollout(prompt.id, ids, [], [], [], "stop")
            reason = reason or "the harness made no model call"
        else:
            final = next((s for s in segments if s.final is not None), segments[-1])
            rollouts = [self._segment_rollout(prompt, s) for s in segments]
            main = next(r for r, s in zip(rollouts, segments) if s is final)
            main.segments = [r for r in rollouts if r is not main] or None
            turn = final.final or final.turns[-1]
            # what a verifier reads: the final call's reply, not the whole segment it ends
            main.completion_text = self.tokenizer.decode(final.ids[turn.start:turn.end], skip_special_tokens=True)
            main.messages = _messages(log, main.completion_text)
        main.env_reward = None if reason else reward
        main.failure = reason or None
        return main

    def _segment_rollout(self, prompt: Prompt, s: Segment) -> Rollout:
        return Rollout(prompt_id=prompt.id, prompt_ids=s.prompt_ids, completion_ids=s.ids,
                       behavior_logprobs=s.logprobs, versions=s.versions, finish_reason=s.finish,
                       completion_text=self.tokenizer.decode(s.ids, skip_special_tokens=True),
                       loss_weights=s.weights if 0 in s.weights else None, turns=s.turns)


def _row(prompt: Prompt) -> bytes:
    """The dataset row a harness gets, pickled for its process; a column that cannot be pickled goes as its repr."""
    row = {**prompt.reward_columns(), "prompt": prompt.text, "model": MODEL_NAME,
           "messages": [dict(m) for m in prompt.messages or [{"role": "user", "content": prompt.text}]]}
    for key, value in row.items():
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 — whatever pickling raises (a lambda, a lock, a generator)
            row[key] = repr(value)
    return pickle.dumps(row)


def _grace(timeout: float) -> float:
    """Seconds past the timeout the parent waits for the worker's own answer before killing it."""
    return 1.0 + 0.05 * timeout


def _drain(server) -> None:
    """Drive the engine until the driver holds no job (the closed episodes' are aborted at its first step)."""
    driver = server.service.driver
    driver.run(lambda: not driver._jobs)


def _messages(log: EpisodeLog, final_text: str) -> list[dict]:
    """The episode as TRL's conversational completion: the final call's messages after its first
    system/user ones, and the reply it got (choice 0)."""
    last = log.calls[-1]
    first = next((i for i, m in enumerate(last.messages) if m["role"] not in ("system", "user")), len(last.messages))
    return [*last.messages[first:], {"role": "assistant", "content": final_text}]
