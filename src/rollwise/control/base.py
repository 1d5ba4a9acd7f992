"""The Controller contract (DESIGN.md, Control) and the prompt source selectors draw from.

The loop calls a controller at fixed points of a step:

- ``select_prompts(source, stats, n) -> prompts``: which prompts this step (``n`` of them);
- ``allocate(prompts, stats, budget) -> budgets``: rollouts per prompt for the first round.
  One-shot allocators return exactly ``budget`` in all; a two-phase allocator (XRPO) returns
  less and spends the rest in ``extend`` once the first round's scores are known;
- ``extend(groups, stats, remaining) -> extra``: after scoring, more rollouts for some
  prompts (XRPO's second phase out of ``remaining``; DARS's depth rounds on top of it).
  Extra rollouts join their prompt's group;
- ``should_continue(partial, stats) -> bool``: per partial rollout (``generate.group.Partial``:
  prompt, tokens and log-probs so far) every ``continue_every`` tokens — online pruning. The
  ``group`` strategy calls it when a controller overrides it and sets ``continue_every``; a
  rollout it stops is aborted in the engine and leaves no tokens in any group (a prompt's
  last rollout is never stopped). Every built-in controller continues everything (``arrol``
  prunes with its own per-prompt balanced choice, ``generate/pruned.py``);
- ``accept(group) -> bool``: per finished, scored group; the loop refills the batch with fresh
  prompts for the groups it drops (``refills_dropped_groups``: dynamic sampling).

Both kinds of extra round are capped (``max_rounds`` per controller, never above
``ROUND_CAP``): no controller can sample forever.

``PromptStats`` (``control/stats.py``) is updated by the loop after every scored round, so
``extend`` and the next step see this step's outcomes.

Randomness: a controller draws from ``rng(salt)``, a generator fixed by (run seed, step, salt)
(``rollwise.seeds.rng``), never from global state, so a resumed run draws the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollwise import seeds
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup

ROUND_CAP = 8  # hard cap on extra rounds (extend or refill) per step, whatever a controller asks


@dataclass
class PromptCursor:
    """What ``select_prompts`` draws from: the task's train stream read at a cursor.

    ``fresh(k)`` takes the next ``k`` prompts (the cursor moves, as without a controller);
    ``revisit(index)`` draws a prompt seen before again, by its stream index. Both return
    tokenized prompts (``prepare`` is the trainer's tokenizer).
    """

    stream: object  # tasks.base.PromptSource: get(index) -> Prompt
    cursor: int
    prepare: object = None  # Prompt -> Prompt (tokenizes)

    def fresh(self, k: int, stats: PromptStats | None = None) -> list[Prompt]:
        out = []
        for i in range(k):
            out.append(self._get(self.cursor + i, stats))
        self.cursor += k
        return out

    def revisit(self, index: int, stats: PromptStats | None = None) -> Prompt:
        return self._get(index, stats)

    def _get(self, index: int, stats: PromptStats | None) -> Prompt:
        prompt = self.stream.get(index)
        if self.prepare is not None:
            prompt = self.prepare(prompt)
        if stats is not None:
            stats.register(prompt.id, index)
        return prompt


class Controller:
    """``control.method: none`` — today's loop: the next ``n`` prompts, ``budget / n`` rollouts each,
    every group accepted, no extra rounds. Subclasses override the hooks they need."""

    name = "none"
    max_rounds = 0  # extra rounds (extend + refill) this controller may run per step
    refills_dropped_groups = False  # accept() may drop groups, and the loop refills them with fresh prompts
    prunes_in_generation = False  # prunes inside generation: the trainer samples with generate/pruned.py, this as its pruner
    restarts_episodes = False  # plans episode restarts from turn prefixes: generate/trace_episodes.py asks it (trace)

    def __init__(self, seed: int = 0, num_generations: int = 8) -> None:
        self.seed = seed
        self.num_generations = num_generations
        self.step = 0  # the training step being collected (set by the loop)

    # -- hooks ------------------------------------------------------------------------------
    def select_prompts(self, source: PromptCursor, stats: PromptStats, n: int) -> list[Prompt]:
        return source.fresh(n)

    def allocate(self, prompts: list[Prompt], stats: PromptStats, budget: int) -> list[int]:
        return equal_split(budget, len(prompts))

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        return [0] * len(groups)

    def should_continue(self, partial, stats: PromptStats) -> bool:
        return True

    def accept(self, group: RolloutGroup) -> bool:
        return True

    # -- around the hooks -------------------------------------------------------------------
    continue_every = 0  # tokens between should_continue calls on one rollout (0: never called)

    @property
    def asks_should_continue(self) -> bool:
        """Whether generation must ask ``should_continue`` at segment boundaries."""
        return self.continue_every > 0 and type(self).should_continue is not Controller.should_continue

    @property
    def runs_extend_rounds(self) -> bool:
        """Whether this controller runs extra rounds for prompts already sampled (``extend``)."""
        return self.max_rounds > 0 and type(self).extend is not Controller.extend

    update_passes = 1  # optimizer passes over the step's batch this controller asks at least (DARS-B's breadth)

    def observe_step(self, groups: list[RolloutGroup], stats: PromptStats) -> None:
        """The step's trained groups, after ``stats`` has recorded every round (bandit updates)."""

    def metrics(self) -> dict[str, float]:
        """This step's numbers (``control/...``), read once after the step's rounds."""
        return {}

    def forward_tokens(self) -> int:
        """Prompt tokens this controller ran through the policy since last asked (difficulty_select's
        embeddings). The loop asks once per step and adds them to the step's token count, so an
        equal-token budget (``train.max_generated_tokens``) charges a selector for its own forwards."""
        return 0

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"controller {self.name} is stateless but the checkpoint holds {sorted(state)}")

    def rng(self, salt: int = 0) -> np.random.Generator:
        """A generator fixed by (run seed, step, salt): resumes draw the same numbers."""
        return seeds.rng(self.seed, self.step, salt)


def equal_split(budget: int, n: int) -> list[int]:
    """``budget`` rollouts over ``n`` prompts as evenly as possible, the first ones taking the remainder.

    >>> equal_split(10, 4)
    [3, 3, 2, 2]
    """
    if n <= 0:
        return []
    q, r = divmod(budget, n)
    return [q + (i < r) for i in range(n)]


def proportional_split(weights: list[float], budget: int, minimum: int = 0) -> list[int]:
    """Integers summing to exactly ``budget``, each ``>= minimum``, the rest proportional to ``weights``
    (largest remainder; ties to the lower index). Falls back to an equal split when every weight
    is 0, and to ``equal_split`` when the minimums alone exceed the budget.

    >>> proportional_split([1.0, 2.0, 1.0], 10, minimum=2)
    [3, 4, 3]
    """
    n = len(weights)
    if n == 0:
        return []
    if minimum * n > budget:
        return equal_split(budget, n)
    free = budget - minimum * n
    total = float(sum(weights))
    if total <= 0:
        return [minimum + x for x in equal_split(free, n)]
    shares = [free * w / total for w in weights]
    base = [int(np.floor(s)) for s in shares]
    left = free - sum(base)
    order = sorted(range(n), key=lambda i: (-(shares[i] - base[i]), i))
    for i in order[:left]:
        base[i] += 1
    return [minimum + b for b in base]
