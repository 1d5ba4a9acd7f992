"""Multi-turn episodes (``rollout.environment``): a rollout is a conversation with an environment.

Each of a prompt's ``budget`` episodes gets its own environment instance (``reset(**row)``).
A turn samples until the tokenizer's EOS; the turn's text is parsed for tool calls
(``tasks/tool_calls.py``); no call — or ``rollout.max_turns`` turns, or the episode's token
budget (``rollout.max_new_tokens``, sampled and inserted tokens together) spent — ends the
episode. Otherwise each call runs (``tasks/environment.py``: errors, hangs and huge outputs
become messages; a call ends at ``rollout.tool_timeout`` whatever it does), and the results
are inserted as token ids — through the chat template for ``hermes`` (the ids its tool
messages and the next assistant header render to), as ``<result>…</result>`` text for
``plain`` — and sampling continues.

Token-faithful (METHODS ``token_faithful``): the rollout's ``completion_ids`` are exactly the
sampled ids with the inserted ids between them, never decoded and re-tokenized text; inserted
ids carry loss weight 0 and behaviour log-prob 0, every sampled id keeps the log-prob it was
sampled with; ``Rollout.turns`` records each model turn's span and the environment's anchor
state (``observation_key``) for ``gigpo``.

What verifiers read: ``Rollout.messages`` is the conversation after the prompt — each assistant
turn decoded from its own sampled ids, and the tool messages inserted after it — and always ends
with the final assistant turn; ``completion_text`` is that final turn. An environment that fails
(``env.failure``: it raised in its constructor, ``reset`` or ``get_reward``, or was lost) ends its
episode, which scores 0 with the reason (``Rollout.failure``) and is counted (``episode/env_failed``).

On an engine that continues a finished sequence with its keys/values (``SlotEngine``:
``SamplingParams.keep_cache``), a turn prefills only the ids inserted since the last one;
another engine is given the whole conversation as a new prompt each turn (the naive harness;
``rollwise bench multiturn`` compares the two). Turns run in rounds: every live episode's next
turn is sampled in one engine run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rollwise.engine.engine import Completion, Request
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import PartialState
from rollwise.generate.base import Generator
from rollwise.generate.conversation import ChatRenderer
from rollwise.seeds import derive
from rollwise.types import Prompt, Rollout, RolloutGroup, Turn

ERROR_KINDS = ("parse", "unknown_tool", "bad_arguments", "raised", "timeout")


def tool_use_metrics(counts: dict, episodes: int) -> dict[str, float]:
    """Tool use of ``episodes`` episodes from their call counts (``EpisodeSampler.generate``'s): calls per
    episode, and — only when there were calls, never a vacuous 0% — the share that could not be parsed
    and the share read but answered with an error (unknown tool, bad arguments, raised, timed out).
    Counted are the calls that got an answer: a call on an episode's last allowed turn is not run.

    >>> tool_use_metrics({"tool_calls": 4, "parse": 1, "raised": 1}, episodes=2)
    {'episode/tool_calls_mean': 2.0, 'episode/parse_failure_rate': 0.25, 'episode/call_error_rate': 0.25}
    """
    calls = counts.get("tool_calls", 0)
    out = {"episode/tool_calls_mean": calls / max(episodes, 1)}
    if calls:
        out["episode/parse_failure_rate"] = counts.get("parse", 0) / calls
        out["episode/call_error_rate"] = sum(counts.get(k, 0) for k in ERROR_KINDS if k != "parse") / calls
    return out


class _FailedEnv:
    """The environment of an episode whose factory raised: no tools, and the reason (it scores 0)."""

    done, schemas = True, []

    def __init__(self, failure: str):
        self.failure = failure

    def reward(self):
        return None

    def state(self):
        return None

    def close(self) -> None:
        pass


@dataclass
class Episode:
    prompt: Prompt
    env: object  # a tasks.environment.EpisodeEnv
    prompt_ids: list[int]
    seeds: tuple[int, int]  # (prompt slot, sample) for derive
    ids: list[int] = field(default_factory=list)  # completion ids: sampled and inserted
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)  # inserted positions
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # assistant turns and tool messages, as text
    finish: str = "stop"
    kv: object = None  # the last turn's cached keys/values (engines that keep them)
    kv_version: int | None = None
    done: bool = False


@dataclass
class EpisodeSampler(Generator):
    """Episodes with ``envs()`` (a factory of ``tasks.environment.EpisodeEnv``), tool calls read by
    ``fmt`` (a ``tasks.tool_calls.ToolFormat``), at most ``max_turns`` model turns."""

    params: SamplingParams
    tokenizer: object
    envs: object
    fmt: object
    max_turns: int = 4

    def generate(self, engine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        episodes = [self._start(p, pi, j) for pi, (p, n) in enumerate(zip(prompts, budgets)) for j in range(n)]
        counts = dict.fromkeys(("tool_calls", *ERROR_KINDS, "truncated"), 0)
        for turn in range(self.max_turns):
            live = [e for e in episodes if not e.done and getattr(e.env, "failure", None) is None]
            if not live:
                break
            for ep, c in zip(live, self._sample_turn(engine, live, seed, turn)):
                self._absorb(ep, c, turn, counts)
        groups = [RolloutGroup(prompt=p, rollouts=[]) for p in prompts]
        owners = [pi for pi, n in enumerate(budgets) for _ in range(n)]
        for pi, ep in zip(owners, episodes):
            groups[pi].rollouts.append(self._rollout(ep))
        metrics = {f"episode/{k}": float(v) for k, v in counts.items()} | tool_use_metrics(counts, len(episodes))
        metrics["episode/env_failed"] = float(sum(r.failure is not None for g in groups for r in g.rollouts))
        metrics["episode/turns_mean"] = sum(len(e.turns) for e in episodes) / max(len(episodes), 1)
        return groups, metrics

    # -- one episode ------------------------------------------------------------------------
    def _start(self, prompt: Prompt, pi: int, j: int) -> Episode:
        """A new episode; an environment that fails to start (``failure`` set) ends it before any turn."""
        env = self._new_env()
        extra = env.reset(prompt.reward_columns()) if getattr(env, "failure", None) is None else None
        return Episode(prompt, env, self._prompt_ids(prompt, extra, env.schemas), (pi, j))

    def _new_env(self):
        try:
            return self.envs()
        except Exception as err:  # a factory's bug: this episode fails (0, with why), the run goes on
            return _FailedEnv(f"the environment factory raised {type(err).__name__}: {err}"[:1000])

    def _prompt_ids(self, prompt: Prompt, extra: str | None, schemas: list[dict]) -> list[int]:
        plain = not self.fmt.uses_chat_template
        messages = [dict(m) for m in (None if plain else prompt.messages) or [{"role": "user", "content": prompt.text}]]
        if extra:
            messages[-1]["content"] += extra
        return self.renderer.prompt_ids(messages, schemas)

    def _sample_turn(self, engine, live: list[Episode], seed: int, turn: int) -> list[Completion]:
        """The next turn of every live episode, in one engine run."""
        params = [replace(self.params, max_new_tokens=self.params.max_new_tokens - len(e.ids),
                          seed=derive(seed, *e.seeds, turn)) for e in live]
        if hasattr(engine, "resume") and turn > 0:
            states = [self._state(e, p) for e, p in zip(live, params)]
            handles = engine.resume(states)
        else:
            first = turn == 0
            handles = engine.submit([Request(e.prompt_ids if first else e.prompt_ids + e.ids,
                                             replace(p, keep_cache=hasattr(engine, "resume")))
                                     for e, p in zip(live, params)])
        done = engine.run_until()
        return [done[h] for h in handles]

    def _state(self, ep: Episode, params: SamplingParams) -> PartialState:
        """Continue ``ep`` after its inserted ids, from its cached keys/values."""
        full = replace(params, max_new_tokens=self.params.max_new_tokens, keep_cache=True)
        return PartialState(prompt_ids=ep.prompt_ids, token_ids=list(ep.ids), logprobs=list(ep.logprobs),
                            versions=list(ep.versions), params=full, seed=params.seed,
                            generator_state=None, forced=list(ep.forced), kv=ep.kv, kv_version=ep.kv_version)

    def _absorb(self, ep: Episode, c: Completion, turn: int, counts: dict) -> None:
        """Add turn ``turn``'s completion to ``ep``; run its tool calls and insert their results."""
        continued = len(c.token_ids) > len(ep.ids) and c.prompt_ids == ep.prompt_ids
        new = c.token_ids[len(ep.ids):] if continued else c.token_ids
        new_lp = c.logprobs[len(ep.ids):] if continued else c.logprobs
        new_v = c.versions[len(ep.ids):] if continued else c.versions
        state = ep.env.state()
        start = len(ep.ids)
        ep.ids += new
        ep.logprobs += new_lp
        ep.versions += new_v
        ep.turns.append(Turn(start, len(ep.ids), state))
        ep.kv, ep.kv_version = getattr(c, "kv", None), getattr(c, "kv_version", None)
        ep.finish = c.finish_reason
        text = self.tokenizer.decode(new, skip_special_tokens=True)  # this turn's sampled ids only
        ep.messages.append({"role": "assistant", "content": text})
        calls = self.fmt.safe_parse(text) if c.finish_reason == "stop" else []
        if not calls or turn + 1 >= self.max_turns:
            ep.done = True
            return
        results = [ep.env.call(call) for call in calls]
        counts["tool_calls"] += len(calls)
        for r in results:
            if r.error:
                counts[r.error] += 1
            counts["truncated"] += r.truncated
        if getattr(ep.env, "done", False) or getattr(ep.env, "failure", None) is not None:
            ep.done = True  # the environment ended the episode (OpenEnv's done) or failed: nothing to answer
            return
        inserted = self._inserted_ids(calls, results)
        if len(ep.ids) + len(inserted) >= self.params.max_new_tokens:
            ep.done, ep.finish = True, "length"  # no room left to answer
            return
        # only results the model is shown join the messages, so they always end with its final turn
        ep.messages += [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(calls, results)]
        ep.forced += range(len(ep.ids), len(ep.ids) + len(inserted))
        ep.ids += inserted
        ep.logprobs += [0.0] * len(inserted)
        ep.versions += [ep.versions[-1] if ep.versions else 0] * len(inserted)

    def _inserted_ids(self, calls, results) -> list[int]:
        messages = [{"role": "tool", "name": c.name or "error", "content": r.text} for c, r in zip(calls, results)]
        return self.renderer.suffix_ids(messages)

    @property
    def renderer(self) -> ChatRenderer:
        return ChatRenderer(self.tokenizer, self.fmt)

    def _rollout(self, ep: Episode) -> Rollout:
        """The episode as a rollout: ``completion_text`` is its final assistant turn (what verifiers read,
        never a tool's output), ``messages`` the whole conversation after the prompt, ending with that turn."""
        weights = [1] * len(ep.ids)
        for i in ep.forced:
            weights[i] = 0
        env_reward = ep.env.reward()
        failure = getattr(ep.env, "failure", None)  # the environment failed (raised, lost, server gone): 0, with why
        getattr(ep.env, "close", lambda: None)()
        final = next((m["content"] for m in reversed(ep.messages) if m["role"] == "assistant"), "")
        return Rollout(prompt_id=ep.prompt.id, prompt_ids=ep.prompt_ids, completion_ids=ep.ids,
                       behavior_logprobs=ep.logprobs, versions=ep.versions, finish_reason=ep.finish,
                       completion_text=final, loss_weights=weights if ep.forced else None, turns=ep.turns,
                       messages=ep.messages, env_reward=env_reward, failure=failure)

