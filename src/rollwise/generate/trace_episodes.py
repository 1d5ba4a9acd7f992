"""Episodes that restart from turn prefixes: the generation half of ``trace`` (control/trace.py).

``TraceEpisodeSampler`` is the ``EpisodeSampler`` (``generate/episode.py``) with a planner: for
each prompt of a ``generate`` call it asks ``planner.restarts(prompt_id, n)`` for up to ``n``
starts ``(parent rollout, k)``; the prompt's other episodes (all of them in the first pass,
when nothing is planned) start fresh. A start with k ≥ 1 continues ``parent``'s first k turns:

- a fresh environment is ``reset`` with the row and the parent's tool calls of those turns are
  replayed in order (read again from its assistant messages with the same format). Each
  turn's anchor state and the ids the results insert must equal the parent's; the prompt ids
  too. An environment that does not reproduce them (not deterministic) gets a fresh episode
  from the root instead (the planner's ``note_restarts``: ``control/trace_replay_mismatches``);
- the episode then holds exactly the parent's ids up to the start of turn k (sampled and
  inserted), with their behaviour log-probs and policy versions, its first k turns and
  messages, and sampling continues from there (the slot engine prefills the copied ids once;
  another engine gets prompt + ids as a new prompt);
- in its rollout the copied prefix has loss weight 0: it is trained once, in the parent.

Episodes at different turns sample together: each one's next turn is seeded by its own turn
index, so a restarted episode's turn k draws differently from its parent's.

The planner is duck-typed (``restarts(prompt_id, n) -> [(Rollout | None, k)]``, optional
``note_restarts(restarted, mismatched)``, told after every call — the counts are the planner's
metrics, since the loop keeps no generator metrics of a controller's extra rounds): this
module knows nothing of control/.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollwise.engine.engine import Completion, Request
from rollwise.generate.episode import Episode, EpisodeSampler
from rollwise.seeds import derive
from rollwise.types import Prompt, Rollout


@dataclass
class TraceEpisode(Episode):
    shared: int = 0  # completion ids copied from the parent's prefix (loss weight 0: trained in the parent)


@dataclass
class TraceEpisodeSampler(EpisodeSampler):
    planner: object = None  # restarts(prompt_id, n) -> [(parent rollout | None, k turns)]; note_restarts(...)

    def generate(self, engine, prompts: list[Prompt], budgets: list[int], seed: int):
        self._starts: dict[tuple[int, int], tuple[Rollout | None, int]] = {}
        for pi, (p, n) in enumerate(zip(prompts, budgets)):
            plan = self.planner.restarts(p.id, n) if self.planner is not None and n > 0 else []
            self._starts.update(((pi, j), start) for j, start in enumerate(plan[:n]))
        self._restarted = self._mismatched = 0
        try:
            groups, metrics = super().generate(engine, prompts, budgets, seed)
        finally:
            self._starts = {}
        if callable(getattr(self.planner, "note_restarts", None)):
            self.planner.note_restarts(self._restarted, self._mismatched)
        return groups, metrics

    # -- starting an episode: fresh, or from a parent's prefix -----------------------------------
    def _start(self, prompt: Prompt, pi: int, j: int) -> TraceEpisode:
        parent, k = getattr(self, "_starts", {}).get((pi, j), (None, 0))
        ep = self._fresh(prompt, pi, j)
        if parent is None or k < 1:
            return ep
        if ep.prompt_ids == parent.prompt_ids and self._replay(ep.env, parent, k):
            self._restarted += 1
            return self._continue(ep, parent, k)
        self._mismatched += 1
        return self._fresh(prompt, pi, j)  # the environment did not come back to the prefix's state

    def _fresh(self, prompt: Prompt, pi: int, j: int) -> TraceEpisode:
        env = self.envs()
        extra = env.reset(prompt.reward_columns())
        return TraceEpisode(prompt, env, self._prompt_ids(prompt, extra, env.schemas), (pi, j))

    def _replay(self, env, parent: Rollout, k: int) -> bool:
        """Run ``parent``'s tool calls of its first ``k`` turns on ``env`` (just reset); whether every
        turn's anchor state and inserted ids came back the same."""
        assistant = [m["content"] for m in parent.messages or [] if m["role"] == "assistant"]
        if len(assistant) <= k or len(parent.turns) <= k:
            return False
        for i in range(k):
            if env.state() != parent.turns[i].state:
                return False
            calls = self.fmt.parse(assistant[i])
            results = [env.call(call) for call in calls]
            inserted = parent.completion_ids[parent.turns[i].end: parent.turns[i + 1].start]
            if not calls or self._inserted_ids(calls, results) != inserted:
                return False
        return True

    @staticmethod
    def _continue(ep: TraceEpisode, parent: Rollout, k: int) -> TraceEpisode:
        """``ep`` (its environment replayed to turn ``k``) holding ``parent``'s ids up to turn ``k``."""
        cut = parent.turns[k].start
        ep.ids, ep.logprobs = list(parent.completion_ids[:cut]), list(parent.behavior_logprobs[:cut])
        ep.versions = list(parent.versions[:cut])
        ep.forced = [i for a, b in zip(parent.turns[:k], parent.turns[1: k + 1]) for i in range(a.end, b.start)]
        ep.turns = list(parent.turns[:k])
        assistant_at = [i for i, m in enumerate(parent.messages) if m["role"] == "assistant"]
        ep.messages = [dict(m) for m in parent.messages[: assistant_at[k]]]
        ep.shared = cut
        return ep

    # -- turns: each episode at its own turn index -------------------------------------------------
    def _sample_turn(self, engine, live: list[Episode], seed: int, turn: int) -> list[Completion]:
        """The next turn of every live episode, in one engine run (fresh and restarted ones together)."""
        resumes = hasattr(engine, "resume")
        params = [replace(self.params, max_new_tokens=self.params.max_new_tokens - len(e.ids),
                          seed=derive(seed, *e.seeds, len(e.turns))) for e in live]
        # on an engine that resumes, later turns continue from the kept cache or (a restart: none) prefill once
        later = [i for i, e in enumerate(live) if e.turns and resumes]
        new = [i for i, e in enumerate(live) if not (e.turns and resumes)]
        handles = {}
        if new:
            handles |= dict(zip(new, engine.submit([Request(live[i].prompt_ids + live[i].ids,
                                                            replace(params[i], keep_cache=resumes)) for i in new])))
        if later:
            handles |= dict(zip(later, engine.resume([self._state(live[i], params[i]) for i in later])))
        done = engine.run_until()
        return [done[handles[i]] for i in range(len(live))]

    def _absorb(self, ep: Episode, c: Completion, turn: int, counts: dict) -> None:
        super()._absorb(ep, c, len(ep.turns), counts)

    def _rollout(self, ep: TraceEpisode) -> Rollout:
        r = super()._rollout(ep)
        if ep.shared:
            weights = r.loss_weights or [1] * len(r.completion_ids)
            r.loss_weights = [0] * ep.shared + weights[ep.shared:]
        return r
