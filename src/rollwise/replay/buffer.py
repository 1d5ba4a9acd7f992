"""A FIFO of rollout groups with the policy version that sampled them (METHODS.md, replay/).

A group keeps everything it was trained with: its rollouts' behaviour log-probs, per-token
``versions`` and advantages (computed within the original group when it was fresh). Its
*birth* version is the oldest of its tokens (``min(versions)``; a partial rollout resumed
under newer weights counts from its first token), and its age under the policy version
``v`` being updated is ``v - birth``. ``sample`` never serves a group older than ``max_age``;
groups that have aged out can never be served again (versions only grow) and are dropped
when ``sample`` or ``drain`` sees them. Eviction at ``capacity`` is FIFO: the group added
first goes first.

Sampling is uniform without replacement among the young-enough groups and does not remove
them: a group can be served again at a later step while it is young enough (experience
replay). It is deterministic given the generator, and the result keeps buffer order (oldest
first), so a buffer restored with ``load_state_dict`` serves the same groups from the same
generator.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from rollwise.types import RolloutGroup


def birth_version(group: RolloutGroup, default: int) -> int:
    """The oldest policy version among the group's tokens (``default`` for a group without tokens).

    >>> from rollwise.types import Prompt, Rollout
    >>> r = lambda v: Rollout("p", [1], [5, 6], [-.1, -.2], v, "stop")
    >>> birth_version(RolloutGroup(Prompt("p", "x"), [r([3, 4]), r([2, 2])]), default=9)
    2
    """
    versions = [v for r in group.rollouts for v in r.versions]
    return min(versions) if versions else default


@dataclass
class Entry:
    group: RolloutGroup
    birth: int  # birth_version(group) when it was added


class ReplayBuffer:
    """FIFO of groups, at most ``capacity``, served while at most ``max_age`` versions old."""

    def __init__(self, capacity: int, max_age: int) -> None:
        if capacity < 1 or max_age < 0:
            raise ValueError(f"ReplayBuffer needs capacity >= 1 and max_age >= 0, got {capacity}, {max_age}")
        self.capacity = capacity
        self.max_age = max_age
        self.entries: deque[Entry] = deque()
        self.evicted = 0  # groups pushed out at capacity (running count)
        self.expired = 0  # groups dropped for age (running count)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, groups: list[RolloutGroup], version: int) -> None:
        """Append ``groups`` (sampled up to policy ``version``), evicting the oldest beyond capacity."""
        for g in groups:
            self.entries.append(Entry(g, birth_version(g, version)))
        while len(self.entries) > self.capacity:
            self.entries.popleft()
            self.evicted += 1

    def servable(self, version: int) -> int:
        """How many groups ``sample`` could serve under policy ``version``."""
        return sum(1 for e in self.entries if version - e.birth <= self.max_age)

    def sample(self, n: int, rng: np.random.Generator, version: int) -> list[RolloutGroup]:
        """Up to ``n`` distinct groups at most ``max_age`` versions old under ``version``, drawn
        uniformly (all of them when fewer are eligible), in buffer order. Nothing is removed."""
        self._expire(version)
        if n <= 0 or not self.entries:
            return []
        if n >= len(self.entries):
            return [e.group for e in self.entries]
        picked = sorted(rng.choice(len(self.entries), size=n, replace=False).tolist())
        return [self.entries[i].group for i in picked]

    def drain(self, version: int) -> list[RolloutGroup]:
        """Every group still young enough under ``version``, oldest first; the buffer is left empty."""
        self._expire(version)
        out = [e.group for e in self.entries]
        self.entries.clear()
        return out

    def clear(self) -> int:
        """Empty the buffer; returns how many groups it held."""
        n = len(self.entries)
        self.entries.clear()
        return n

    def _expire(self, version: int) -> None:
        kept = deque(e for e in self.entries if version - e.birth <= self.max_age)
        self.expired += len(self.entries) - len(kept)
        self.entries = kept

    def state_dict(self) -> dict:
        """Groups (the records themselves: picklable dataclasses) with their births and counters;
        goes through ``torch.save``/``torch.load(weights_only=False)`` as it is."""
        return {"groups": [e.group for e in self.entries], "births": [e.birth for e in self.entries],
                "evicted": self.evicted, "expired": self.expired}

    def load_state_dict(self, state: dict) -> None:
        """Restore the contents; ``capacity`` and ``max_age`` stay the run config's."""
        self.entries = deque(Entry(g, b) for g, b in zip(state["groups"], state["births"], strict=True))
        self.evicted, self.expired = state["evicted"], state["expired"]
