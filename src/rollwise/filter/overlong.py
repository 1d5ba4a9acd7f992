"""``overlong_shaping``: DAPO's soft overlong punishment as a TRL-style reward function.

"DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (Yu et al., 2025) adds a
length term to the reward, with L_max the length budget and L_cache the soft band below it:

- 0 for |y| ≤ L_max − L_cache;
- ((L_max − L_cache) − |y|)/L_cache for L_max − L_cache < |y| ≤ L_max (down to −1);
- −1 beyond L_max.

Our choice: L_cache = L_max // 5 by default (METHODS.md). |y| is the number of completion
token ids, so the term is added in filter scoring like any other reward (it must be final
before ``control.accept``). The other half of DAPO's overlong handling — masking truncated
responses out of the loss — is TRL's ``mask_truncated_completions`` and lives elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """The soft overlong term for a completion of ``length`` tokens.

    >>> [overlong_penalty(n, 20, 4) for n in (16, 18, 20, 21)]
    [0.0, -0.5, -1.0, -1.0]
    """
    if not 0 <= cache <= max_len:
        raise ValueError(f"overlong cache must be in [0, max_len={max_len}], got {cache}")
    start = max_len - cache
    if length <= start:
        return 0.0
    if length <= max_len:
        return (start - length) / cache  # cache > 0 here: start < length ≤ max_len
    return -1.0


def overlong_reward(max_len: int, cache: int | None = None) -> Callable[..., list[float]]:
    """A reward function ``fn(prompts, completions, completion_ids, **kwargs) -> list[float]``.

    It scores each completion by ``overlong_penalty(len(completion_ids[i]), max_len, cache)``;
    ``cache`` defaults to ``max_len // 5``.

    >>> fn = overlong_reward(20, 4)
    >>> fn(prompts=["p", "p"], completions=["a", "b"], completion_ids=[[0] * 18, [0] * 3])
    [-0.5, 0.0]
    """
    cache = max_len // 5 if cache is None else cache
    overlong_penalty(0, max_len, cache)  # validate now, not at the first scoring call

    def overlong(prompts, completions, completion_ids, **kwargs) -> list[float]:
        return [overlong_penalty(len(ids), max_len, cache) for ids in completion_ids]

    return overlong


def add_overlong_penalty(groups, max_len: int, cache: int | None = None) -> dict[str, float]:
    """The DAPO preset's shaping in the filter stage: add the overlong term to every rollout's
    reward (recorded as the ``overlong`` component); returns the term's batch mean."""
    cache = max_len // 5 if cache is None else cache
    terms = []
    for g in groups:
        for r in g.rollouts:
            term = overlong_penalty(r.num_tokens, max_len, cache)
            r.reward += term
            r.reward_components["overlong"] = term
            terms.append(term)
    return {"reward/overlong": sum(terms) / max(len(terms), 1)}
