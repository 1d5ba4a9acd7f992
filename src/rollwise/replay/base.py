"""The Replay contract (METHODS.md, replay/): what a step trains on besides its fresh groups.

The loop calls a replay method at fixed points of a step:

- ``fresh_prompts(n, step) -> int``: before generation, how many fresh prompts step ``step``
  samples when it trains on ``n`` groups' worth (the rest is served from the buffer);
- ``compose(fresh, step=, version=) -> (groups, metrics)``: after scoring and after
  ``optim.objective.assign_advantages`` on ``fresh`` (advantages are computed within the
  original groups), the groups to train: fresh and/or replayed. Replayed groups keep their
  stored behaviour log-probs, versions and advantages (nothing is recomputed, and the loop must
  not mutate them: the buffer holds the same objects). Adds what the method keeps to its
  buffer. ``version`` is the policy version being updated; a group's age is ``version`` minus
  its oldest token's version (``buffer.birth_version``);
- ``update_passes(step) -> int``: optimizer passes over the step's batch (ReMix's UTD);
- ``reincarnate(step) -> bool``: True exactly once, at ReMix's reincarnation, when the loop
  resets the reference model to the current policy;
- ``progress(step, fraction)``: before step ``step``, how far the run is towards whichever limit
  stops it (``train.steps``, ``max_generated_tokens``, ``max_minutes``: the largest used/limit),
  so a method can act at a fraction of the run however it is bounded (ReMix's reincarnation).

``replay.method: none`` (this class) is on-policy training: ``compose`` returns ``fresh``
itself, one update per step, nothing kept.

Randomness: a method draws from ``rng(step, salt)``, a generator fixed by (run seed, step,
salt) (``rollwise.seeds.rng``; the salts are named there), never from global state, so a
resumed run draws the same numbers. ``state_dict`` holds the buffer (the ``RolloutGroup``
records themselves) and every counter; it goes through ``torch.save``/``torch.load(weights_only=False)``
as it is.
"""

from __future__ import annotations

import numpy as np

from rollwise import seeds
from rollwise.replay.buffer import birth_version
from rollwise.types import RolloutGroup


class Replay:
    """``replay.method: none``: on-policy, every step trains exactly its fresh groups."""

    name = "none"

    def __init__(self, seed: int = 0, prompts_per_step: int = 0, total_steps: int = 0) -> None:
        self.seed = seed
        self.prompts_per_step = prompts_per_step
        self.total_steps = total_steps

    def fresh_prompts(self, n: int, step: int) -> int:
        return n

    def compose(self, fresh: list[RolloutGroup], *, step: int, version: int
                ) -> tuple[list[RolloutGroup], dict[str, float]]:
        return fresh, {}

    def update_passes(self, step: int) -> int:
        return 1

    def reincarnate(self, step: int) -> bool:
        return False

    def progress(self, step: int, fraction: float) -> None:
        """Before step ``step`` the run has used ``fraction`` (0..1) of its budget."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"replay method {self.name} is stateless but the checkpoint holds {sorted(state)}")

    def rng(self, step: int, salt: int = 0) -> np.random.Generator:
        """A generator fixed by (run seed, step, salt): resumes draw the same numbers."""
        return seeds.rng(self.seed, step, salt)


def mean_length(groups: list[RolloutGroup]) -> float:
    """Mean completion tokens per rollout (0 for no rollouts): ReMix's "whipping effect" shows here."""
    lengths = [r.num_tokens for g in groups for r in g.rollouts]
    return sum(lengths) / len(lengths) if lengths else 0.0


def age_metrics(served: list[RolloutGroup], version: int) -> dict[str, float]:
    """``replay/age_mean``, ``replay/age_max`` of the served groups (0 when none was served)."""
    ages = [version - birth_version(g, version) for g in served]
    return {"replay/age_mean": sum(ages) / len(ages) if ages else 0.0,
            "replay/age_max": float(max(ages)) if ages else 0.0}
