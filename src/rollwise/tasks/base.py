"""What a task is: a train stream of prompts, a held-out eval split, rewards, demonstrations.

Train prompts are addressed by an integer cursor (``train.get(i)``), so a checkpoint only
needs the cursor to resume the data stream exactly. Procedural tasks generate prompt ``i``
from ``(seed, i)``; file datasets walk a seeded permutation per epoch.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rollwise.types import Prompt


class PromptSource(Protocol):
    def get(self, index: int) -> Prompt: ...


@dataclass
class ListSource:
    """A finite list of prompts, visited in a fresh seeded order each epoch."""

    prompts: Sequence[Prompt]
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError("dataset has no training prompts")
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.prompts)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # keep one epoch's order in memory
        return self._orders[epoch]

    def get(self, index: int) -> Prompt:
        epoch, pos = divmod(index, len(self.prompts))
        return self.prompts[self._order(epoch)[pos]]


@dataclass
class Task:
    """Everything the loop needs from a task.

    ``rewards`` maps a name to a TRL-style reward function
    (``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``);
    ``demonstrate(prompt)`` returns a correct completion for the SFT warm start (or None
    when the task has no demonstrations; None for a row: that row has none) — for a multi-turn
    episode, a ``tasks.tool_demos.Conversation`` (rendered in the run's tool format and chat
    template, as its episodes are), or a list of ``(text, the model wrote it)`` segments (an
    episode already written as plain-format text): each model turn ends with EOS, what the
    environment inserts is not trained (``train/sft.py``).

    ``judge_from_rewards``: the eval judge is the first of the recipe's ``rewards:`` when it lists
    any, else the first of ``rewards`` (``task.name: file`` without ``task.reward``;
    ``filter/registry.py``). ``check_tokenizer(tokenizer)`` is called once with the run's tokenizer:
    it raises a ``ConfigError`` for a task the tokenizer cannot serve and returns a line for the log
    at start (or None).
    """

    name: str
    train: PromptSource
    eval: list[Prompt]
    rewards: dict[str, Callable]
    demonstrate: Callable[[Prompt], object] | None = None  # str | Conversation | segments | None
    description: str = ""
    stop_strings: list[str] = field(default_factory=list)
    judge_from_rewards: bool = False
    check_tokenizer: Callable[[object], str | None] | None = None
