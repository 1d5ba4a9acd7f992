"""The records that flow through every stage: Prompt → Rollout → RolloutGroup.

These are plain dataclasses (never dicts with string keys) so every stage can read a
field by name and a type checker can follow it. ``TrainBatch`` (padded tensors) is built
from groups at the last moment, in ``rollwise.optim.batch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "aborted", "pruned"]


@dataclass
class Prompt:
    """One prompt and what its verifier needs.

    ``columns`` carries every extra dataset field (e.g. ``answer``, ``tests``) and is passed
    to reward functions as keyword arguments, TRL-style.
    """

    id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    answer: str | None = None
    columns: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] | None = None  # conversational prompt ({role, content}), if any

    def reward_columns(self) -> dict[str, Any]:
        """Keyword arguments for reward functions: ``answer`` plus every extra column."""
        cols = dict(self.columns)
        if self.answer is not None:
            cols.setdefault("answer", self.answer)
        return cols


@dataclass
class Rollout:
    """One sampled completion of a prompt, carried through Filter, Control, Replay, Optimize.

    Per-token lists (``completion_ids``, ``behavior_logprobs``, ``versions``) have equal
    length: ``versions[t]`` is the policy version that sampled token ``t`` (a partial
    rollout resumed under newer weights spans several versions).
    """

    prompt_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    behavior_logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    completion_text: str = ""
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_reasons: dict[str, str] = field(default_factory=dict)
    advantage: list[float] | None = None  # per completion token, set by optim
    node_path: list[int] | None = None  # tree rollouts: node ids from root to leaf
    # per-token loss weight: 0 = not trained (a forced token; a tree prefix trained in another
    # leaf), k = stands for k rollouts (a tree node shared by k leaves, trained once); None = all 1
    loss_mask: list[int] | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.behavior_logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Rollout per-token fields disagree: {n} completion ids, "
                f"{len(self.behavior_logprobs)} logprobs, {len(self.versions)} versions"
            )
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(f"Rollout loss_mask has {len(self.loss_mask)} entries for {n} completion ids")

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)


@dataclass
class RolloutGroup:
    """The rollouts of one prompt: a flat group, or the leaves of a tree (``tree`` is then a
    ``rollwise.generate.forest.Tree`` and each rollout's ``node_path`` names its nodes)."""

    prompt: Prompt
    rollouts: list[Rollout]
    tree: Any | None = None  # tree rollouts keep their node structure here

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def pass_rate(self) -> float:
        return sum(r.reward > 0.5 for r in self.rollouts) / max(len(self.rollouts), 1)


class Score(float):
    """A reward value that also says why: still a plain float to TRL-style code.

    Reward functions may return ``Score(0.0, "no final answer")``; the scoring stage records
    the reason on the rollout (``Rollout.reward_reasons``).
    """

    reason: str

    def __new__(cls, value: float, reason: str = "") -> "Score":
        obj = super().__new__(cls, value)
        obj.reason = reason
        return obj
