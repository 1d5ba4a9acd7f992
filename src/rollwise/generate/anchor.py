"""DaGRPO's off-policy anchors: the reference solution as one more rollout of a hard group
("Distinctiveness-Aware GRPO", 2025; the advantage half is ``optim/dagrpo.py``).

A group with at most one correct rollout (``max_positive``) gets the task's demonstration of its
prompt as an extra rollout: its token ids (the completion text's, no special tokens, then the stop
token), reward from the run's own verifiers — kept only if it verifies (r = 1) — and behaviour
log-probs that are the sampling policy's own, teacher-forced, so its importance ratio is fixed at 1
(the paper's choice: an anchor is trained as if sampled, with its group advantage). Turned on by
``rollout.anchors`` (``objective.method: dagrpo`` fills it); works with every strategy built on
``group`` sampling.

Where we depart: the paper draws anchors from a stronger model's high-quality answers; ours is the
task's reference solution (``Task.demonstrate``), and a prompt without one gets no anchor.
"""

from __future__ import annotations

from rollwise.generate.base import Rounds
from rollwise.types import Rollout, RolloutGroup


def needs_anchor(group: RolloutGroup, max_positive: int = 1) -> bool:
    """At most ``max_positive`` of the group's rollouts (failed ones aside) are correct."""
    live = [r for r in group.rollouts if r.failure is None]
    return bool(live) and sum(r.correct for r in live) <= max_positive


def add_anchors(groups: list[RolloutGroup], rounds: Rounds, stop_token_ids: tuple[int, ...],
                max_positive: int = 1) -> dict[str, float]:
    """Append a verified reference rollout to every group that ``needs_anchor``; returns ``anchor/*`` metrics."""
    tried = added = 0
    for g in groups:
        reference = rounds.demonstrate(g.prompt) if needs_anchor(g, max_positive) else None
        if not reference:
            continue
        tried += 1
        ids = rounds.encode_text(reference) + list(stop_token_ids[:1])
        version = max((v for r in g.rollouts for v in r.versions[-1:]), default=0)
        anchor = Rollout(prompt_id=g.prompt.id, prompt_ids=list(g.prompt.token_ids), completion_ids=ids,
                         behavior_logprobs=rounds.logprobs(list(g.prompt.token_ids), ids),
                         versions=[version] * len(ids), finish_reason="stop", completion_text=reference)
        rounds.score([RolloutGroup(g.prompt, [anchor])])
        if anchor.correct:
            g.rollouts.append(anchor)
            added += 1
    return {"anchor/tried": float(tried), "anchor/added": float(added)}
