"""``fapo``: flawed positives get partial credit once clean solutions appear (FAPO).

FAPO, "Flawed-Aware Policy Optimization" (Ding et al., 2025): a generative reward model with
process-level reward localises reasoning errors and flags *flawed positives* — correct final
answers reached by guessing or by jumps in the working; a parameter-free penalty tolerates them
early and shifts optimisation to reliable reasoning as clean solutions appear.

The rule (``fapo_rewards``, per group; METHODS.md's choice — the paper leaves the penalty's
form open): clean correct → 1; flawed correct → 1 − f, where f is the group's share of clean
correct rollouts; wrong → 0. A group with no clean solution keeps full credit for its flawed
positives.

The testbed (``arith_flaw``): the ``arith`` task's answer-only verifier reads just the number
after ``#``, so it admits flawed working. A completion of ``a+b`` / ``a-b`` is *clean* when its
working is the task's column-by-column working step for step (``filter.arith.solve``: each
column's digits, carry/borrow in and out, ``neg`` for a negative result), and *flawed* when the
answer is right but the working is missing (the answer alone: a jump) or departs from it at some
step (the reason names the first: ``step 2 wrote 4+5+0=09, expected 4+5+1=10``). Products
(``*``) have no working: never flawed.

Where we depart: the paper's detector is a GenRM trained to localise errors in free-form
reasoning; ours is an exact rule on a synthetic task, so "flawed" is known, not estimated. The
penalty is applied in the reward (``rewards: [{name: fapo}]``, in place of ``arith``), so every
advantage estimator sees it. A controller's extra round (xrpo, dars) is scored as its own groups:
f counts that round's rollouts. Showing FAPO's effect on process reliability needs a model that
produces flawed positives often enough — the tiny model copies its SFT working, so few occur.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.filter.arith import parse_answer, solve
from rollwise.filter.rewards import as_text, final_turn
from rollwise.types import RolloutGroup, Score

CLEAN, FLAWED, WRONG = "clean", "flawed", "wrong"


def fapo_rewards(kinds: Sequence[str]) -> list[float]:
    """One group's rewards from each rollout's kind (clean / flawed / wrong).

    >>> fapo_rewards(["clean", "flawed", "wrong", "wrong"]), fapo_rewards(["flawed", "wrong", "wrong", "wrong"])
    ([1.0, 0.75, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0])
    """
    f = sum(k == CLEAN for k in kinds) / max(len(kinds), 1)  # the group's share of clean correct rollouts
    return [1.0 if k == CLEAN else 1.0 - f if k == FLAWED else 0.0 for k in kinds]


def arith_flaw(a: int, op: str, b: int, completion: str) -> str | None:
    """Why the working of ``completion`` (for ``a op b``) is not the task's column-by-column
    working, or None when it is (or when the operator has no working: ``*``).

    >>> arith_flaw(347, "+", 58, " 7+8+0=15 4+5+1=10 3+0+1=04 #405") is None
    True
    >>> arith_flaw(347, "+", 58, " #405"), arith_flaw(347, "+", 58, " 7+8+0=15 4+5+0=09 3+0+1=04 #405")
    ('no working: the answer alone', 'step 2 wrote 4+5+0=09, expected 4+5+1=10')
    """
    want = solve(a, op, b).rsplit("#", 1)[0].split()
    if not want:
        return None
    got = completion.strip().rsplit("#", 1)[0].split()
    if not got:
        return "no working: the answer alone"
    for i, (g, w) in enumerate(zip(got, want), start=1):
        if g != w:
            return f"step {i} wrote {g[:24]}, expected {w}"
    if len(got) != len(want):
        return f"{len(got)} working steps, expected {len(want)}"
    return None


def classify(group: RolloutGroup) -> list[tuple[str, str, int | None]]:
    """(kind, why, the answer read) per rollout of an arith group."""
    cols = group.prompt.columns or {}
    expected = group.prompt.answer
    out = []
    for r in group.rollouts:
        text = as_text(final_turn(r))
        got = parse_answer(text)
        if got is None or expected is None or got != int(expected):
            why = "no final '#<integer>' answer" if got is None else f"wrong answer {got} (expected {expected})"
            out.append((WRONG, why, got))
            continue
        flaw = arith_flaw(int(cols["a"]), cols["op"], int(cols["b"]), text) if {"a", "op", "b"} <= set(cols) else None
        out.append((FLAWED, flaw, got) if flaw else (CLEAN, "", got))
    return out


class Fapo:
    """FAPO on arith: correct answers with flawed column working get 1 − (the group's share of clean
    correct rollouts); clean ones 1, wrong 0 (replaces the arith reward)."""

    __name__ = "fapo"
    verifier_name = "arith"  # its answer check is arith's: the eval judge is among the training rewards

    def score_groups(self, groups: list[RolloutGroup]) -> tuple[list[Score], dict[str, float]]:
        """(one Score per rollout, in group order; metrics ``fapo/flawed_positives``: the share of
        correct rollouts that are flawed, ``fapo/penalised``: flawed positives given less than 1)."""
        out: list[Score] = []
        correct = flawed = penalised = 0
        for g in groups:
            kinds = classify(g)
            rewards = fapo_rewards([k for k, _, _ in kinds])
            for (kind, why, got), r in zip(kinds, rewards):
                answer = None if got is None else str(got)
                reason = f"flawed positive ({why}): 1 - clean share" if kind == FLAWED else why
                out.append(Score(r, reason, answer=answer))
                correct += kind != WRONG
                flawed += kind == FLAWED
                penalised += kind == FLAWED and r < 1.0
        metrics = {"fapo/flawed_positives": flawed / max(correct, 1), "fapo/penalised": float(penalised)}
        return out, metrics



def arith_working(prompts, completions, a=None, op=None, b=None, **_) -> list[Score]:
    """1.0 when an arith completion's column working is the task's, step for step (products: 1), else
    0.0 naming the first wrong step — whatever the final answer (pow3r's process criterion).

    >>> arith_working(["2+2="], [" 2+2+0=04 #4", " #4"], a=[2, 2], op=["+", "+"], b=[2, 2])
    [1.0, 0.0]
    """
    out = []
    for i, completion in enumerate(completions):
        if a is None or op is None or b is None or a[i] is None:
            out.append(None)  # not an arith row: not applicable
            continue
        flaw = arith_flaw(int(a[i]), op[i], int(b[i]), as_text(completion))
        out.append(Score(0.0, flaw) if flaw else Score(1.0))
    return out
