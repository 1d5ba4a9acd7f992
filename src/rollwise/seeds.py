"""Every seed a run derives, in one place.

A run has one seed (``seed``; ``sampling_seed`` re-draws the training rollouts alone).
Everything random is a function of it and of where it is used — never of global state or of
thread timing — so a resumed run, the async producer and a Ray rollout worker draw exactly
what the synchronous, uninterrupted run draws:

- model init, data order, the engine's own stream, eval sampling: ``seed`` itself (python,
  numpy and torch are seeded with it; checkpoints keep those RNG states);
- a training step's rollouts: ``step_seed(sampling seed, step)``;
- a round of that step (``control/rounds.py``: extend and refill rounds sample again):
  ``round_seed(step seed, salt)``, the salt naming the round — ``FIRST_ROUND``,
  ``refill_round(n)``, ``extend_round(n)``, ``GUIDED_ROUND`` (guided exploration's hinted rollouts);
- one request of a round (``generate/``): ``derive(round seed, prompt index, sample index)``;
- a controller's or a replay method's draws: ``rng(run seed, step, salt)``.

``derive`` is Python's hash of a tuple of ints, masked to 62 bits: the same in every process
(ints are not hash-randomised) and on every Python since 3.8. Changing any formula here changes
every run's numbers; ``tests/test_seeds.py`` pins them.
"""

from __future__ import annotations

import numpy as np

MASK = 2**62 - 1  # derived seeds are non-negative and fit an int64 (torch.Generator.manual_seed)

FIRST_ROUND = 0  # the salt of a step's first round: its seed is the step seed itself
EXTEND_BASE = 100  # extend rounds' salts start above every refill round's (refills stop at ROUND_CAP < 100)
GUIDED_ROUND = 99  # the salt of a step's guided round (generate/guide.py: hinted rollouts for groups that failed)
REPLAY_SAMPLE = 1  # rng(run seed, step, REPLAY_SAMPLE): the groups a replay buffer serves (replay/rollout_replay)


def derive(*parts: int) -> int:
    """A seed fixed by ``parts`` (a parent seed and indices), spread over 62 bits.

    >>> derive(7, 1) == derive(7, 1) != derive(7, 2)
    True
    """
    return hash(parts) & MASK


def step_seed(seed: int, step: int) -> int:
    """The seed of training step ``step``'s rollouts (``seed``: the run's sampling seed).

    >>> step_seed(3, 5)
    3000014
    """
    return seed * 1_000_003 + step


def refill_round(n: int) -> int:
    """The salt of a step's ``n``-th refill round (dynamic sampling; ``n`` = 1, 2, …)."""
    return n


def extend_round(n: int) -> int:
    """The salt of a step's ``n``-th extend round (XRPO, DARS; ``n`` = 1, 2, …)."""
    return EXTEND_BASE + n


def is_extend_round(salt: int) -> bool:
    """Whether ``salt`` names an extend round (not the first round or a refill)."""
    return salt > EXTEND_BASE


def round_seed(base: int, salt: int) -> int:
    """The seed of one round of a step whose seed is ``base``: ``base`` itself for the first round,
    else derived from it and the round's salt (an extra round never repeats the first one's samples)."""
    return base if salt == FIRST_ROUND else derive(base, salt)


def rng(seed: int, step: int, salt: int = 0) -> np.random.Generator:
    """A generator fixed by (run seed, step, salt), for a controller's or a replay method's draws:
    a resumed run draws the same numbers."""
    return np.random.default_rng([seed, step, salt])
