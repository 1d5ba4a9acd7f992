"""``LiveRollouts``: the engine run a strategy steps itself, so it can look at every live
rollout between two steps and abort some (online pruning: ``group`` with a gate, ``pruned``).

``run(after_step)`` steps the engine until none of the handles is live, recording each
completion; ``after_step(finished)`` runs after every step with that step's completions. A
strategy aborts rollouts with ``abort(handles)``: live ones are ended in the engine (slot freed,
no completion, ``engine.stats.aborted_tokens``), finished ones are forgotten; neither comes
back from ``completions``. Tree-shaped strategies step their own ``Forest`` (``forest.py``),
whose stopped branches stay leaves instead.
"""

from __future__ import annotations

from collections.abc import Callable

from rollwise.engine.engine import Completion
from rollwise.engine.protocol import BranchingEngine


class LiveRollouts:
    def __init__(self, engine: BranchingEngine, handles: list[int]) -> None:
        self.engine = engine
        self.alive = set(handles)  # handles still sampling
        self.done: dict[int, Completion] = {}  # handle -> completion, finished and not aborted

    def run(self, after_step: Callable[[list[Completion]], None]) -> None:
        """Step the engine until no handle is live; ``after_step(finished)`` after every step."""
        while self.alive:
            finished = [c for c in self.engine.step() if c.handle in self.alive]
            for c in finished:
                self.alive.discard(c.handle)
                self.done[c.handle] = c
            after_step(finished)

    def abort(self, handles: list[int]) -> None:
        """Drop these rollouts: the live ones are aborted in the engine (in the order given)."""
        live = [h for h in handles if h in self.alive]
        if live:
            self.engine.abort(live)
        self.alive.difference_update(handles)
        for h in handles:
            self.done.pop(h, None)

    def completions(self, handles: list[int]) -> list[Completion | None]:
        """The completion of each handle, None for an aborted one."""
        return [self.done.get(h) for h in handles]
