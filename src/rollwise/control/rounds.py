"""Extra rounds of a step: ``extend`` (more rollouts for prompts already sampled) and
``accept`` + refill (fresh prompts for dropped groups), both capped.

The trainer passes ``run_round(prompts, budgets, salt) -> (groups, sampled_tokens)``, which
generates, scores and records the groups in ``PromptStats``; the salt names the round
(``rollwise.seeds.extend_round(n)``, ``refill_round(n)``) and fixes its seed. Everything here
is plain list work, so the caps and the bookkeeping are tested without a model
(tests/test_control.py).

``PromptPrefixes`` keeps a step's prompt prefixes cached in the engine while a controller
that extends runs its rounds, so an extend round copies them instead of prefilling again.

Extra rollouts of a prompt join its group (``merge_group``): a flat group gains rollouts; a
tree group gains the new round's root branches as further children of its root, so
``tree_adv`` still sees one tree per prompt.
"""

from __future__ import annotations

from collections.abc import Callable

from rollwise import seeds
from rollwise.control.base import ROUND_CAP, Controller, PromptCursor
from rollwise.control.stats import PromptStats
from rollwise.types import Prompt, RolloutGroup, Tree

RunRound = Callable[[list[Prompt], list[int], int], tuple[list[RolloutGroup], int]]


def extend_rounds(controller: Controller, stats: PromptStats, groups: list[RolloutGroup], run_round: RunRound,
                  remaining: int) -> dict[str, float]:
    """Ask ``controller.extend`` for more rollouts until it asks for none or the round cap; merge them in."""
    rounds = rollouts = tokens = 0
    cap = min(controller.max_rounds, ROUND_CAP)
    while rounds < cap:
        extra = controller.extend(groups, stats, remaining)
        if len(extra) != len(groups) or any(k < 0 for k in extra):
            raise ValueError(f"{controller.name}.extend returned {extra} for {len(groups)} groups")
        wanted = [(g, k) for g, k in zip(groups, extra) if k > 0]
        if not wanted:
            break
        rounds += 1
        new, sampled = run_round([g.prompt for g, _ in wanted], [k for _, k in wanted], seeds.extend_round(rounds))
        for (g, _), more in zip(wanted, new):
            merge_group(g, more)
        remaining = max(0, remaining - sum(extra))
        rollouts += sum(extra)
        tokens += sampled
    if not controller.runs_extend_rounds:  # a controller that never extends logs nothing
        return {}
    return {"control/extend_rounds": float(rounds), "control/extend_rollouts": float(rollouts),
            "control/extend_tokens": float(tokens)}


def accept_and_refill(controller: Controller, stats: PromptStats, source: PromptCursor, groups: list[RolloutGroup],
                      run_round: RunRound, want: int, budget_per_prompt: int) -> tuple[list[RolloutGroup], dict]:
    """Keep the groups ``controller.accept`` takes; refill the missing ones with fresh prompts, at
    most ``max_rounds`` times (never above ``ROUND_CAP``); return at most ``want`` groups.

    If no group was accepted by the cap, the last round's groups are returned as they are
    (a step never trains on nothing; their rows carry no signal and the update skips them).
    """
    kept = [g for g in groups if controller.accept(g)]
    dropped = len(groups) - len(kept)
    if not controller.refills_dropped_groups:
        return (kept or groups), ({"control/dropped_groups": float(dropped)} if dropped else {})
    rounds = tokens = 0
    last = groups
    cap = min(controller.max_rounds, ROUND_CAP)
    while len(kept) < want and rounds < cap:
        rounds += 1
        prompts = controller.select_prompts(source, stats, want - len(kept))
        budgets = controller.allocate(prompts, stats, budget_per_prompt * len(prompts))
        last, sampled = run_round(prompts, budgets, seeds.refill_round(rounds))
        tokens += sampled
        for g in last:
            if controller.accept(g):
                kept.append(g)
            else:
                dropped += 1
    metrics = {"control/refill_rounds": float(rounds), "control/refill_tokens": float(tokens),
               "control/dropped_groups": float(dropped), "control/kept_groups": float(min(len(kept), want)),
               "control/cap_hit": float(len(kept) < want)}
    return (kept[:want] or last), metrics


class PromptPrefixes:
    """``with PromptPrefixes(controller, engine, n):`` — for a controller that extends (XRPO, DARS)
    on an engine that can (``SlotEngine.keep_prefixes``), the engine keeps the cached prefixes of
    the step's ``n`` prompts until the block ends, so an extend round for a prompt copies its
    prefix instead of prefilling it again. ``metrics()`` then gives the prompt tokens reused
    (``control/prefix_reused_tokens``; nothing for other controllers or engines)."""

    def __init__(self, controller: Controller, engine, n: int) -> None:
        self.engine, self.n = engine, n
        self.active = controller.runs_extend_rounds and hasattr(engine, "keep_prefixes")
        self.reused: int | None = None

    def __enter__(self) -> "PromptPrefixes":
        if self.active:
            self.engine.keep_prefixes(self.n)
            self.before = self.engine.stats.prefix_cache_tokens
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self.engine.keep_prefixes(0)
            self.reused = self.engine.stats.prefix_cache_tokens - self.before

    def metrics(self) -> dict[str, float]:
        return {} if self.reused is None else {"control/prefix_reused_tokens": float(self.reused)}


def merge_group(into: RolloutGroup, more: RolloutGroup) -> None:
    """Add ``more``'s rollouts (same prompt, a later round) to ``into``; graft trees root to root."""
    if more.prompt.id != into.prompt.id:
        raise ValueError(f"merge_group: prompt {more.prompt.id} into the group of {into.prompt.id}")
    if into.tree is None or more.tree is None:
        if (into.tree is None) != (more.tree is None):
            raise ValueError("merge_group: a tree group and a flat group of one prompt")
        into.rollouts.extend(more.rollouts)
        return
    offset = graft(into.tree, more.tree)
    for r in more.rollouts:
        r.node_path = [0] + [n + offset for n in r.node_path[1:]]
    into.rollouts.extend(more.rollouts)


def graft(tree: Tree, other: Tree) -> int:
    """Append ``other``'s nodes to ``tree`` (ids shifted by the returned offset), its root's children
    becoming children of ``tree``'s root."""
    offset = len(tree.nodes) - 1  # other's root (id 0) maps onto tree's root
    for node in other.nodes[1:]:
        parent = 0 if node.parent == 0 else node.parent + offset
        new = type(node)(node.id + offset, parent, node.start, node.end)
        tree.nodes.append(new)
        tree.nodes[parent].children.append(new.id)
    tree.removed.update(n + offset for n in other.removed if n != 0)
    return offset
