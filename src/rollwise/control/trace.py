"""``trace``: TRACE (Tree Rollout Allocation for Contrastive Exploration) — "TRACE: A Unified
Rollout Budget Allocation Framework for Efficient Agentic Reinforcement Learning" (Zou et al.,
2026, arXiv:2606.11119): each model turn of a multi-turn episode is a tree node, and the
rollout budget goes to the prompt roots and to the turn prefixes most likely to yield mixed
terminal rewards.

Per prompt with budget G (``rollout.num_generations``):

1. ``allocate`` gives a first pass of ⌊G/2⌋ (at least 1) fresh episodes; the loop samples and
   scores them.
2. ``extend`` builds the prompt's prefix tree from them (``prefix_nodes``): the root (the
   prompt: a fresh episode) and, for every first-pass episode and every k from 1 to its turns
   − 1, the prefix of its first k turns with the ids inserted after them. Episodes whose first
   k turns are the same ids share one node. Each node gets a predicted success p̂
   (``success_estimate``) and the rest of the prompt's budget, G − ⌊G/2⌋, is spent greedily one
   rollout at a time on the node of highest p̂(1−p̂)/(1+n_anchor) (``trace_allocation``:
   n_anchor = rollouts started from it — the first pass for the root, 0 for a prefix — plus
   the ones given so far, so scores are recomputed after each). Nodes with p̂ ∈ {0, 1} get
   none. If no node has 0 < p̂ < 1, the rest goes to fresh episodes from the root
   (``control/trace_fallback_rollouts``). Every prompt gets exactly G rollouts.
3. The second round runs the plan (``restarts``) in ``generate/trace_episodes.py``: a restart
   from a prefix ``reset``s a fresh environment with the row, replays the prefix's tool calls
   in order, checks they give back the same inserted ids, and samples on after the prefix's ids.
   Its rollout joins the prompt's group.

The predictor: p̂ of a node whose rollouts (the first-pass episodes through it) number at
least ``settle_after`` (2) and all agree is exactly 0 or 1 (decided: it gets no budget; so are
its descendants). Otherwise p̂ is the posterior mean under a Beta prior of strength 2 centred
on the parent node's p̂ — Beta(1, 1) at the root: (s + 1)/(n + 2). A posterior mean alone is
never 0 or 1, so without the first rule an all-correct prompt's prefixes would still draw
budget; the parent-centred prior makes a failing branch of a mostly-solved prompt (and a
lucky one of a mostly-failed prompt) the more uncertain prefix.

Metrics (``control/trace_*``, per step): ``prefix_rollouts`` and ``root_rollouts`` planned
(second pass), ``fallback_rollouts`` and ``no_open_prefix`` (prompts with no 0 < p̂ < 1),
``open_prefixes``, and from the sampler ``prefix_restarts`` (run) and ``replay_mismatches``.

Departures from the paper (and from METHODS ``trace``):
- Predictor: counts (above), not an MLP on the prefix history. A prefix one episode passed
  through keeps a prior-shrunk estimate; the paper's shared predictor would generalise across
  prefixes and prompts.
- Advantages: GRPO-style over the prompt's G rollouts (children and first-pass episodes alike),
  not ``tree_adv``. The prefix a child shares with its parent has loss weight 0 in the child:
  those tokens are trained once, in the parent, with the parent's advantage.
- Environment state is restored by replaying actions only (no snapshots); an environment that
  does not reproduce the prefix's observations gets a fresh episode from the root instead
  (``control/trace_replay_mismatches``).
- One second pass per step; its children start no new prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from rollwise.config import StrictModel
from rollwise.control.base import Controller, equal_split
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, Rollout, RolloutGroup

PRIOR_STRENGTH = 2.0  # pseudo-rollouts of the parent's estimate in a node's prior (Beta(1, 1) at the root)


class TraceConfig(StrictModel):
    settle_after: int = Field(2, ge=1, description="a prefix whose first-pass rollouts number at least this and all "
                              "agree is decided (p = 0 or 1) and gets no budget")


@dataclass
class PrefixNode:
    """A node of a prompt's turn tree: ``rollout``'s first ``turns`` turns and the ids inserted after
    them (the root: ``turns`` 0, ``rollout`` None — a fresh episode)."""

    rollout: Rollout | None
    turns: int
    parent: int | None  # index of the node one turn shorter (None: the root)
    passed: int = 0  # first-pass rollouts through it
    correct: int = 0  # of those, the correct ones
    started: int = 0  # rollouts started from it (the root: the first pass)


def prefix_nodes(rollouts: list[Rollout]) -> list[PrefixNode]:
    """The root, then each rollout's prefixes of 1 … turns − 1 turns (rollouts whose first k turns
    are the same ids share a node); a node's parent comes before it."""
    root = PrefixNode(None, 0, None, len(rollouts), sum(r.correct for r in rollouts), len(rollouts))
    nodes, index = [root], {}
    for r in rollouts:
        parent = 0
        for k in range(1, len(r.turns or [])):
            key = tuple(r.completion_ids[: r.turns[k].start])
            if key not in index:
                index[key] = len(nodes)
                nodes.append(PrefixNode(r, k, parent))
            parent = index[key]
            nodes[parent].passed += 1
            nodes[parent].correct += r.correct
    return nodes


def success_estimate(correct: int, passed: int, parent_p: float, settle_after: int = 2) -> float:
    """p̂ of a node: ``correct``/``passed`` when at least ``settle_after`` rollouts all agree, else the
    posterior mean with ``PRIOR_STRENGTH`` pseudo-rollouts at the parent's estimate.

    >>> success_estimate(2, 4, 0.5), round(success_estimate(1, 1, 0.5), 3), success_estimate(3, 3, 0.5)
    (0.5, 0.667, 1.0)
    """
    if passed >= settle_after and correct in (0, passed):
        return correct / passed
    return (correct + PRIOR_STRENGTH * parent_p) / (passed + PRIOR_STRENGTH)


def node_estimates(nodes: list[PrefixNode], settle_after: int = 2) -> list[float]:
    """``success_estimate`` of every node, parents first (the root's prior: ½)."""
    p: list[float] = []
    for node in nodes:
        prior = 0.5 if node.parent is None else p[node.parent]
        p.append(success_estimate(node.correct, node.passed, prior, settle_after))
    return p


def trace_score(p: float, anchored: int) -> float:
    """p̂(1−p̂)/(1+n_anchor): how likely one more rollout from the node splits its outcomes, shared
    among the rollouts already started there.

    >>> trace_score(0.5, 0), trace_score(0.5, 4), trace_score(1.0, 0)
    (0.25, 0.05, 0.0)
    """
    return p * (1 - p) / (1 + anchored)


def trace_allocation(p_hat: list[float], started: list[int], budget: int) -> list[int]:
    """Rollouts per node, one at a time to the highest ``trace_score`` (recomputed after each; ties
    to the lower index); nodes with p̂ ∈ {0, 1} get none. All zeros when no node has 0 < p̂ < 1.

    >>> trace_allocation([0.5, 2 / 3, 0.9, 1.0], [4, 0, 0, 0], 3)  # scores .05, .222, .09, 0
    [0, 2, 1, 0]
    """
    given = [0] * len(p_hat)
    open_nodes = [i for i, p in enumerate(p_hat) if 0 < p < 1]
    if not open_nodes:
        return given
    for _ in range(budget):
        best = max(open_nodes, key=lambda i: (trace_score(p_hat[i], started[i] + given[i]), -i))
        given[best] += 1
    return given


class Trace(Controller):
    name = "trace"
    max_rounds = 1  # the second pass
    restarts_episodes = True  # the trainer samples episodes with generate/trace_episodes.py, this as its planner

    def __init__(self, cfg: TraceConfig, **kw) -> None:
        super().__init__(**kw)
        self.cfg = cfg
        self.totals: dict[str, int] = {}  # this step's G per prompt id
        self.plans: dict[str, list[tuple[Rollout | None, int]]] = {}  # prompt id -> (parent, k turns) per restart
        self._counts: dict[str, float] = {}

    def allocate(self, prompts: list[Prompt], stats: PromptStats, budget: int) -> list[int]:
        totals = equal_split(budget, len(prompts))
        self.totals = {p.id: g for p, g in zip(prompts, totals)}
        self.plans, self._counts = {}, dict.fromkeys(
            ("prefix_rollouts", "root_rollouts", "fallback_rollouts", "no_open_prefix", "open_prefixes",
             "prefix_restarts", "replay_mismatches"), 0.0)
        return [max(1, g // 2) if g else 0 for g in totals]

    def extend(self, groups: list[RolloutGroup], stats: PromptStats, remaining: int) -> list[int]:
        return [self._plan(g) for g in groups]

    def _plan(self, group: RolloutGroup) -> int:
        """Plan the rest of ``group``'s prompt's budget over its prefix tree; return how many."""
        want = max(0, self.totals.get(group.prompt.id, self.num_generations) - len(group.rollouts))
        if want == 0:
            return 0
        nodes = prefix_nodes(group.rollouts)
        p = node_estimates(nodes, self.cfg.settle_after)
        given = trace_allocation(p, [n.started for n in nodes], want)
        plan = [(nodes[i].rollout, nodes[i].turns) for i, k in enumerate(given) for _ in range(k)]
        fallback = want - len(plan)
        plan += [(None, 0)] * fallback
        c = self._counts
        c["prefix_rollouts"] += sum(given[1:])
        c["root_rollouts"] += given[0] + fallback
        c["fallback_rollouts"] += fallback
        c["no_open_prefix"] += float(fallback > 0)
        c["open_prefixes"] += sum(0 < x < 1 for x in p[1:])
        self.plans.setdefault(group.prompt.id, []).extend(plan)
        return want

    # the planner protocol of generate/trace_episodes.py ----------------------------------------
    def restarts(self, prompt_id: str, n: int) -> list[tuple[Rollout | None, int]]:
        """The next ``n`` planned starts of ``prompt_id`` (fewer if fewer are planned), removed from the plan."""
        plan = self.plans.get(prompt_id)
        if not plan:
            return []
        taken, self.plans[prompt_id] = plan[:n], plan[n:]
        return taken

    def note_restarts(self, restarted: int, mismatched: int) -> None:
        if self._counts:
            self._counts["prefix_restarts"] += restarted
            self._counts["replay_mismatches"] += mismatched

    def metrics(self) -> dict[str, float]:
        return {f"control/trace_{k}": float(v) for k, v in self._counts.items()}
