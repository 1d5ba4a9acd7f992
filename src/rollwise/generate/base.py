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
"""

from __future__ import annotations

from rollwise.engine.protocol import TokenEngine
from rollwise.types import Prompt, RolloutGroup


class Generator:
    """Base class of the rollout strategies; the trainer only ever sees this interface."""

    def prompts_wanted(self, n: int) -> int:
        return n

    def generate(self, engine: TokenEngine, prompts: list[Prompt], budgets: list[int],
                 seed: int) -> tuple[list[RolloutGroup], dict[str, float]]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} is stateless but the checkpoint holds state {sorted(state)}")
