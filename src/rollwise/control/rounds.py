"""Extra rounds of a step: ``extend`` (more rollouts for prompts already sampled) and
``accept`` + refill (fresh prompts for dropped groups), both capped.

The trainer passes ``run_round(prompts, budgets, salt) -> (groups, sampled_tokens)``, which
generates, scores and records the groups in ``PromptStats``; everything here is plain list
work, so the caps and the bookkeeping are tested without a model (tests/test_control.py).

Extra rollouts of a prompt join its group (``merge_group``): a flat group gains rollouts; a
tree group gains the new round's root branches as further children of its root, so
``tree_adv`` still sees one tree per prompt.
"""

from __future__ import annotations

from collections.abc import Callable

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
        new, sampled = run_round([g.prompt for g, _ in wanted], [k for _, k in wanted], 100 + rounds)
        for (g, _), more in zip(wanted, new):
            merge_group(g, more)
        remaining = max(0, remaining - sum(extra))
        rollouts += sum(extra)
        tokens += sampled
    if not controller.extends:  # a controller that never extends logs nothing
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
    if not controller.refills:
        return (kept or groups), ({"control/dropped_groups": float(dropped)} if dropped else {})
    rounds = tokens = 0
    last = groups
    cap = min(controller.max_rounds, ROUND_CAP)
    while len(kept) < want and rounds < cap:
        rounds += 1
        prompts = controller.select_prompts(source, stats, want - len(kept))
        budgets = controller.allocate(prompts, stats, budget_per_prompt * len(prompts))
        last, sampled = run_round(prompts, budgets, rounds)
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
