"""``remix``: ReMix — "Squeeze the Soaked Sponge: Efficient Off-policy Reinforcement Finetuning
for Large Language Model" (2025; METHODS.md: ReMix).

PPO/GRPO reuse past rollouts in three parts:

1. mix-policy proximal policy gradient with a higher update-to-data ratio: each step trains a
   1:1 mix of fresh groups and groups replayed from the last ``max_age`` (4) policy versions,
   which keep their own behaviour log-probs (the ``rollout_replay`` buffer, ``share`` .5), with
   ``utd`` (2) optimizer passes per step (``update_passes``);
2. KL-convex policy constraint β[½KL(π_θ‖π_old) + ½KL(π_θ‖π_ref)], k3: ``remix_objective``
   gives ``objective.beta = β/2`` (reference) and ``objective.prox_kl_coef = β/2`` (proximal,
   ``optim.objective.policy_loss``);
3. policy reincarnation at ``reincarnate_at`` of the run — the first step before which the run
   has used that fraction of whichever limit stops it (``progress``: the largest used/limit over
   ``train.steps``, ``max_generated_tokens``, ``max_minutes``; a run bounded by a token budget
   reincarnates half-way through its tokens, not half-way through a step count it never
   reaches): the buffer is cleared, UTD drops to 1, nothing is replayed or stored again, and
   ``reincarnate(step)`` is True once so the loop resets π_ref to the current policy. Built with
   a fixed ``total_steps`` (and nothing reporting progress), the fraction is ``step/total_steps``.

The paper reports two failure modes of far-off-policy training, a "whipping effect" (an
implicit preference for shorter responses) and collapsing self-reflection: ``compose`` logs
``replay/length_fresh`` / ``replay/length_served`` and ``replay/reflection_rate`` (a keyword
proxy, below).

Departures from the paper:
- The proximal policy π_old is the weights before this step's update (recomputed, no
  gradient), not each replayed sample's own behaviour policy; the behaviour/proximal gap is the
  loop's ``tis_mode`` weight (decoupled PPO).
- Replayed groups keep the advantages computed when they were fresh.
- Reincarnation switches at a fraction of the run's budget, not at a validation plateau; after
  it the run is the base algorithm (with the KL terms) on fresh data.
- ``replay/reflection_rate`` counts completions containing a reflection keyword
  (``REFLECTION_WORDS``), a proxy rather than the paper's measurement.
"""

from __future__ import annotations

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.replay.rollout_replay import RolloutReplay
from rollwise.types import RolloutGroup

REFLECTION_WORDS = ("wait", "let me check", "double-check", "verify", "re-examine", "alternatively")


class RemixConfig(StrictModel):
    share: float = Field(0.5, ge=0, lt=1, description="share of each step's groups replayed (0.5 = the 1:1 mix; "
                         "0 = no replay)")
    max_age: int = Field(4, ge=0, description="replay groups sampled by the last max_age policy versions")
    capacity: int = Field(256, ge=1, description="buffer size in groups (FIFO eviction)")
    skip_zero_signal: bool = Field(True, description="do not store groups whose advantages are all 0")
    utd: int = Field(2, ge=1, description="optimizer passes over each step's batch before reincarnation "
                     "(update-to-data ratio)")
    beta: float = Field(0.04, ge=0, description="KL-convex coefficient: beta/2 goes to objective.beta (reference) "
                        "and beta/2 to objective.prox_kl_coef (proximal)")
    reincarnate_at: float = Field(0.5, ge=0, le=1, description="fraction of the run (of whichever limit stops it: "
                                  "train.steps, max_generated_tokens, max_minutes) at which to clear the buffer, drop "
                                  "to UTD 1 and reset the reference (1 = never)")


def reflection_rate(groups: list[RolloutGroup]) -> float:
    """Share of completions whose text contains a reflection keyword (0 for no rollouts)."""
    texts = [r.completion_text.lower() for g in groups for r in g.rollouts]
    hits = sum(any(w in t for w in REFLECTION_WORDS) for t in texts)
    return hits / len(texts) if texts else 0.0


class Remix(RolloutReplay):
    name = "remix"

    def __init__(self, cfg: RemixConfig, **kw) -> None:
        super().__init__(cfg, **kw)
        self.utd = cfg.utd
        self.reincarnate_at = cfg.reincarnate_at
        self.reincarnation_step: int | None = None  # the first on-policy step, once the run is that far
        self.reincarnated = False  # reincarnate() has answered True

    def progress(self, step: int, fraction: float) -> None:
        if self.reincarnation_step is None and self.reincarnate_at < 1 and fraction >= self.reincarnate_at:
            self.reincarnation_step = step

    def on_policy(self, step: int) -> bool:
        """Step ``step`` is at or after the reincarnation."""
        if self.total_steps:  # a fixed step count: its fraction (the trainer reports progress instead)
            self.progress(step, step / self.total_steps)
        return self.reincarnation_step is not None and step >= self.reincarnation_step

    def replaying(self, step: int) -> bool:
        return self.share > 0 and not self.on_policy(step)

    def compose(self, fresh: list[RolloutGroup], *, step: int, version: int
                ) -> tuple[list[RolloutGroup], dict[str, float]]:
        if self.on_policy(step):  # on-policy from here: drop whatever is left
            self.planned.clear()
            cleared = self.buffer.clear()
            return fresh, {"replay/cleared_groups": float(cleared)} if cleared else {}
        groups, metrics = super().compose(fresh, step=step, version=version)
        return groups, metrics | {"replay/reflection_rate": reflection_rate(fresh)}

    def update_passes(self, step: int) -> int:
        return 1 if self.on_policy(step) else self.utd

    def reincarnate(self, step: int) -> bool:
        if self.reincarnated or not self.on_policy(step):
            return False
        self.reincarnated = True
        return True

    def state_dict(self) -> dict:
        return super().state_dict() | {"reincarnated": self.reincarnated,
                                       "reincarnation_step": self.reincarnation_step}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.reincarnated = state["reincarnated"]
        self.reincarnation_step = state.get("reincarnation_step")  # absent in checkpoints before it was kept
