"""The records that flow through every stage: Prompt → Rollout → RolloutGroup.

These are plain dataclasses (never dicts with string keys) so every stage can read a
field by name and a type checker can follow it. ``TrainBatch`` (padded tensors) is built
from groups at the last moment, in ``rollwise.optim.batch``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "aborted", "pruned"]

CORRECT_ABOVE = 0.5  # a verifier score above this counts as a correct answer (verifiers score 0 or 1)


def is_correct(score: float) -> bool:
    """The one definition of "correct": a verifier score above ``CORRECT_ABOVE``.

    >>> is_correct(1.0), is_correct(0.4)
    (True, False)
    """
    return score > CORRECT_ABOVE


def jaccard(a: list[int], b: list[int], n: int) -> float:
    """The one definition of how alike two completions are: the Jaccard similarity of their token n-gram
    sets (1.0 when both have none and are equal). LATR prunes look-alike branches with it, DaGRPO masks
    look-alike pairs.

    >>> jaccard([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], 4)
    0.3333333333333333
    """
    ga = {tuple(a[i : i + n]) for i in range(len(a) - n + 1)}
    gb = {tuple(b[i : i + n]) for i in range(len(b) - n + 1)}
    if not ga and not gb:
        return 1.0 if a == b else 0.0
    return len(ga & gb) / len(ga | gb)


ZERO_STD = 1e-6  # relative: a group whose reward std is at most ZERO_STD·max(1, |mean|) has no spread


def is_zero_signal(rewards: Sequence[float]) -> bool:
    """The one definition of "no signal": a group's rewards do not spread — fewer than two, or a
    Bessel-corrected std (float64) at most ``ZERO_STD`` relative to their magnitude, i.e. equal up
    to rounding. Dynamic sampling drops such groups, every advantage estimator gives them exactly 0
    (so the update skips their rows and replay does not store them), ``groups/zero_signal`` counts
    them. Relative, so rounding noise on rewards of any magnitude counts as no spread.

    >>> is_zero_signal([0.0, 1.0, 0.0]), is_zero_signal([0.3, 0.3 + 1e-9]), is_zero_signal([10.0, 10.0 + 1e-5])
    (False, True, True)
    """
    n = len(rewards)
    if n < 2:
        return True
    values = [float(r) for r in rewards]
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in values) / (n - 1))
    return std <= ZERO_STD * max(1.0, abs(mean))


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
    # a plain prompt tokenized through the tokenizer's chat template, when it has one, as one user message
    # (``task.chat_template``); reward functions still get ``text``, TRL's format for a plain prompt
    chat_template: bool = False
    # task.labels: none (rollwise.tasks.labels): the reference answer, hidden from training — never a reward
    # column; only train/pseudo_label_acc (filter/majority_vote.py) reads it. None = nothing hidden
    hidden_answer: str | None = None

    def reward_columns(self) -> dict[str, Any]:
        """Keyword arguments for reward functions: ``answer`` plus every extra column."""
        cols = dict(self.columns)
        if self.answer is not None:
            cols.setdefault("answer", self.answer)
        return cols


@dataclass(frozen=True)
class Turn:
    """One action of a multi-turn episode (``Rollout.turns``): the model sampled
    ``completion_ids[start:end]`` in this turn, from the state the environment identified by
    ``state`` (a key equal across episodes exactly when the state is the same: GiGPO's anchor
    states; None = the environment gives none). ``reward`` is the step reward the environment
    gave this action (0 when only the episode is scored)."""

    start: int
    end: int
    state: str | None = None
    reward: float = 0.0


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
    # the reward functions' weighted total (the verifiers' verdict), set by the Filter stage; shaping
    # terms (DAPO's overlong penalty) are added to ``reward`` only, so they never change what is correct
    score: float | None = None
    reward: float = 0.0  # what advantages are computed from: ``score`` + shaping terms
    reward_components: dict[str, float] = field(default_factory=dict)
    reward_reasons: dict[str, str] = field(default_factory=dict)
    # the final answer the verifier read from the completion, normalised (``Score.answer`` of the
    # first reward function that gave one; None: none found, or no verifier reports answers); maj@k votes with it
    extracted_answer: str | None = None
    advantage: list[float] | None = None  # per completion token, set by optim
    node_path: list[int] | None = None  # tree rollouts: node ids from root to leaf
    # per-token loss weight: 0 = not trained (a forced token; a tree prefix trained in another
    # leaf), k = stands for k rollouts (a tree node shared by k leaves, trained once); None = all 1
    loss_weights: list[int] | None = None
    # multi-turn episodes (rollout.environment): the model's turns, in order; the ids between them were
    # inserted by the environment (tool results, feedback) and carry loss weight 0. None = a single completion
    turns: list[Turn] | None = None
    # the episode as TRL's conversational completion: assistant turns and tool messages (what reward functions get)
    messages: list[dict] | None = None
    env_reward: float | None = None  # the environment's get_reward() for this episode (reward component "environment")
    # harness episodes (rollout.harness): the episode's other token-faithful segments (calls that did not extend
    # this one's ids); each trains as its own row with this rollout's advantage (optim.build_batch)
    segments: list[Rollout] | None = None
    failure: str | None = None  # why the rollout could not be scored (a harness that raised or hung): reward 0
    # majority_vote: a confident pseudo-label's positive advantages are multiplied by this (1 − share; optim)
    positive_advantage_scale: float = 1.0
    # poise: b_i, the value probe's estimate from the group's other rollouts; v05: the group's fused baseline b
    value_baseline: float | None = None
    # old_logit_repair: per completion token, the trainer's log-prob under the version that sampled it
    # (optim/old_logits.py); the update's ratio is taken against it instead of the proximal policy. None = not kept
    old_logprobs: list[float] | None = None
    # guided exploration (generate/guide.py, nudge.py): the context the rollout was sampled under — a hint, a
    # strategy — prepended to the prompt; ``prompt_ids`` are the bare prompt's all the same (it trains on x, its
    # behaviour log-probs are those under x⊕context: the IS weight corrects the gap). None = sampled from x itself
    context: str | None = None
    # scope (generate/scope.py): completion tokens from here on were written by the corrector, not sampled
    # (off-policy); the ones before are the rollout's own. None = every token sampled
    corrected_from: int | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.behavior_logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Rollout per-token fields disagree: {n} completion ids, "
                f"{len(self.behavior_logprobs)} logprobs, {len(self.versions)} versions"
            )
        if self.loss_weights is not None and len(self.loss_weights) != n:
            raise ValueError(f"Rollout loss_weights has {len(self.loss_weights)} entries for {n} completion ids")
        if self.turns is not None:  # from a checkpoint (asdict): dicts back to Turn
            self.turns = [t if isinstance(t, Turn) else Turn(**t) for t in self.turns]
        if self.segments is not None:
            self.segments = [s if isinstance(s, Rollout) else Rollout(**s) for s in self.segments]

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)

    @property
    def correct(self) -> bool:
        """The verifiers judged this completion correct (``is_correct(score)``; ``reward`` before scoring)."""
        return is_correct(self.reward if self.score is None else self.score)


@dataclass
class Node:
    """A maximal run of completion tokens between two forks, shared by every leaf below it."""

    id: int
    parent: int | None  # None for the root
    start: int  # completion positions [start, end) this node holds
    end: int | None = None  # None while a branch is still growing it
    children: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return (self.end or self.start) - self.start


@dataclass
class Tree:
    """One prompt's rollout tree (kept on ``RolloutGroup.tree``)."""

    nodes: list[Node] = field(default_factory=lambda: [Node(0, None, 0, 0)])
    removed: set[int] = field(default_factory=set)  # pruned nodes (kept for ids, not part of the tree)

    def add(self, parent: int, start: int) -> int:
        node = Node(len(self.nodes), parent, start)
        self.nodes.append(node)
        self.nodes[parent].children.append(node.id)
        return node.id

    def path(self, node: int) -> list[int]:
        """Node ids from the root to ``node``."""
        out = []
        while node is not None:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]

    def subtree(self, node: int) -> list[int]:
        """``node`` and every node below it."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(self.nodes[n].children)
        return out

    def remove(self, node: int) -> None:
        """Drop a pruned node and everything below it."""
        self.nodes[self.nodes[node].parent].children.remove(node)
        self.removed.update(self.subtree(node))

    def live_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.id not in self.removed]

    @property
    def unique_tokens(self) -> int:
        """Completion tokens held by the tree's nodes, each counted once."""
        return sum(n.length for n in self.live_nodes())

    def to_dict(self) -> dict:
        return {"nodes": [{"id": n.id, "parent": n.parent, "start": n.start, "end": n.end}
                          for n in self.live_nodes()]}


@dataclass
class RolloutGroup:
    """The rollouts of one prompt: a flat group, or the leaves of a tree (``tree`` then holds
    the node structure and each rollout's ``node_path`` names its nodes)."""

    prompt: Prompt
    rollouts: list[Rollout]
    tree: Tree | None = None  # tree rollouts keep their node structure here

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    @property
    def live_rewards(self) -> list[float]:
        """The rewards of the rollouts that did not fail (``Rollout.failure``): what the group's
        statistics — advantages, its zero-signal verdict, pass rates — are computed from."""
        return [r.reward for r in self.rollouts if r.failure is None]

    @property
    def num_correct(self) -> int:
        """Rollouts the judge counts as correct (``Rollout.correct``)."""
        return sum(r.correct for r in self.rollouts)

    @property
    def pass_rate(self) -> float:
        return self.num_correct / max(len(self.rollouts), 1)


class Score(float):
    """A reward value that also says why: still a plain float to TRL-style code.

    Reward functions may return ``Score(0.0, "no final answer")``; the scoring stage records
    the reason on the rollout (``Rollout.reward_reasons``). A verifier that extracts a final
    answer also returns it, normalised (``Score(1.0, answer="13")``): the scoring stage keeps it
    as ``Rollout.extracted_answer``, and maj@k votes with it (``rollwise.eval.majority``).

    >>> s = Score(0.0, "wrong answer 12 (expected 13)", answer="12")
    >>> s + 1, s.reason, s.answer
    (1.0, 'wrong answer 12 (expected 13)', '12')
    """

    reason: str
    answer: str | None

    def __new__(cls, value: float, reason: str = "", answer: str | None = None) -> "Score":
        obj = super().__new__(cls, value)
        obj.reason = reason
        obj.answer = answer
        return obj
