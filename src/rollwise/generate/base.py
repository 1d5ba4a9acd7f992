"""The contract every rollout strategy keeps (DESIGN.md, Generator).

``generate(engine, prompts, budgets, seed) -> (groups, metrics)`` on an engine that keeps
``engine/protocol.py``'s ``TokenEngine`` (``BranchingEngine`` for the strategies that fork,
pause or abort): ``budgets[i]`` rollouts (or
tree leaves) for ``prompts[i]`` (0: an empty group — a rollout worker gets the step's whole
prompt list with 0 for the prompts other workers sample, so a prompt's seeds depend on its
place in the step, not on the worker); ``seed`` fixes the step's sampling whatever the batching;
``metrics`` are the strategy's own numbers for this step (``tree/...``, ``april/...``).
``prompts_wanted(n)`` says how many fresh prompts a step that needs ``n`` groups should pass
(APRIL carries unfinished groups over and takes fewer). ``state_dict()`` /
``load_state_dict()`` hold what outlives a step (APRIL's carry-over buffer, TreePO's entropy
window) and are saved with every checkpoint; stateless strategies return ``{}``.

``revise(groups, rounds)`` runs after the step's first round is scored: guided exploration
(``guide``, ``scope``) adds or corrects rollouts of the groups that failed, through ``rounds``
(a ``Rounds``: the trainer's sampling, scoring and encoding, since a strategy imports no task,
reward or tokenizer). The others return ``{}``.
"""

from __future__ import annotations

from typing import Protocol

from rollwise.engine.protocol import TokenEngine
from rollwise.types import Prompt, RolloutGroup


class Rounds(Protocol):
    """What ``Generator.revise`` may ask of the trainer (``train/collect.py``'s ``RoundSampler``)."""

    def sample(self, prompts: list[Prompt], budgets: list[int], salt: int, observe: bool = True
               ) -> tuple[list[RolloutGroup], dict[str, float], int]:
        """Generate ``budgets[i]`` rollouts of ``prompts[i]`` (its ``token_ids``) and score them against its
        ``text`` and columns: (groups, metrics, tokens sampled). ``observe=False`` keeps them out of the
        per-prompt statistics (rollouts sampled under a hint say nothing about the bare prompt's pass rate)."""
        ...

    def score(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """Score rollouts built without sampling (a corrected rollout) as a round's are scored."""
        ...

    def encode(self, prompt: Prompt) -> list[int]:
        """The token ids of ``prompt`` (its text or messages, through the chat template where the task uses one)."""
        ...

    def encode_text(self, text: str) -> list[int]:
        """The token ids of completion text (no special tokens added): what a corrector writes."""
        ...

    def demonstrate(self, prompt: Prompt) -> str | None:
        """The task's demonstration (a correct completion) of ``prompt``, or None when it has none."""
        ...

    def logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """Per-token log-probs of ``completion_ids`` after ``prompt_ids`` under the sampling policy (teacher-forced,
        under the sampling settings): the behaviour log-probs of tokens the policy did not sample itself."""
        ...


class Generator:
    """Base class of the rollout strategies; the trainer only ever sees this interface."""

    def prompts_wanted(self, n: int) -> int:
        return n

    def generate(self, engine: TokenEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        raise NotImplementedError

    def revise(self, groups: list[RolloutGroup], rounds: Rounds) -> dict[str, float]:
        """Add or correct rollouts of the scored first round's ``groups`` in place (guided exploration)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} is stateless but the checkpoint holds state {sorted(state)}")
