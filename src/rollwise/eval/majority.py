"""maj@k: majority vote over k sampled completions by the verifier's extracted answer.

Self-consistency (Wang et al., 2022, "Self-Consistency Improves Chain of Thought Reasoning in
Language Models") as verl and NeMo-RL report it: each of a prompt's k samples votes for its
final answer (``Rollout.extracted_answer``, the normalised answer the verifier read, see
``rollwise.types.Score``); the prompt counts as solved when the most voted answer is a correct
one. Where we are specific:

- a sample without an extracted answer (no ``#``, no ``<answer>`` tag, a verifier that does not
  report answers) abstains; a prompt where every sample abstains is not solved;
- ties go to the tied answer sampled first (the lowest sample index): deterministic, and
  blind to which answer is correct (breaking ties towards the correct one would overstate it);
- the majority answer is correct when a sample that gave it was judged correct. Verifiers are
  deterministic in the answer they extract, so its samples agree; answers compare as strings
  after the verifier's own normalisation (``0.5`` and ``1/2`` are two answers);
- one vote over all k samples (k = ``train.eval_samples``), not verl's bootstrap over subsets.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-None answer (ties: the one sampled first), or None if no sample answered.

    >>> majority_answer(["3", None, "4", "4", "3"]), majority_answer([None, None])
    ('3', None)
    """
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == top)


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """One prompt's maj@k: the majority answer of its samples was judged correct.

    >>> majority_correct(["7", "8", "8"], [True, False, False]), majority_correct(["7", "7", "8"], [True, True, False])
    (False, True)
    """
    if len(answers) != len(correct):
        raise ValueError(f"majority_correct got {len(answers)} answers for {len(correct)} verdicts")
    winner = majority_answer(answers)
    return winner is not None and any(ok for a, ok in zip(answers, correct) if a == winner)


def maj_at_k(prompts: Sequence[tuple[Sequence[str | None], Sequence[bool]]]) -> float:
    """Mean maj@k over prompts, each given as ``(answers, correct)`` of its k samples.

    >>> maj_at_k([(["1", "1", "2"], [True, True, False]), ([None, "5"], [False, False])])
    0.5
    """
    if not prompts:
        raise ValueError("maj_at_k got no prompts")
    return sum(majority_correct(a, c) for a, c in prompts) / len(prompts)
