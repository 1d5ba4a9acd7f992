"""The candidate pool of the selectors that draw prompts again (``vade``, ``gdro``).

A step's candidates are ``fresh_per_step`` new stream prompts (default: as many as the step
selects; never so few that the candidates fall short of the picks) followed by every prompt
drawn before that ``PromptStats`` still holds, the least recently seen forgotten beyond
``pool_size``. The selector scores the candidates and picks some; a seen one is drawn again
from the stream by its index (``PromptCursor.revisit``). Both options are declared once here
and used in each selector's config (``FreshPerStep``, ``PoolSize``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from rollwise.control.base import PromptCursor
from rollwise.control.stats import PromptRecord, PromptStats
from rollwise.types import Prompt

FreshPerStep = Annotated[int | None, Field(ge=0, description="new stream prompts among each step's candidates "
                                           "(null = as many as the step selects)")]
PoolSize = Annotated[int, Field(ge=1, description="seen prompts kept as candidates (least recently seen forgotten)")]


@dataclass
class Candidates:
    """One step's candidates: the fresh prompts, then the seen ones (by id; none of them fresh)."""

    fresh: list[Prompt]
    seen: list[str]

    def __len__(self) -> int:
        return len(self.fresh) + len(self.seen)

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.fresh] + self.seen

    def records(self, stats: PromptStats) -> list[PromptRecord]:
        """Each candidate's record, in candidate order (a fresh prompt's may be the prior)."""
        return [stats.get(pid) for pid in self.ids]

    def prompts(self, picks: Iterable[int], source: PromptCursor, stats: PromptStats) -> list[Prompt]:
        """The picked candidates (positions) as prompts, in pick order: seen ones drawn again."""
        n = len(self.fresh)
        return [self.fresh[i] if i < n else source.revisit(stats.get(self.seen[i - n]).index, stats) for i in picks]


def candidates(source: PromptCursor, stats: PromptStats, n: int, fresh_per_step: int | None,
               pool_size: int) -> Candidates:
    """This step's candidates for ``n`` picks; takes the fresh prompts from ``source`` (its cursor moves)."""
    stats.forget(pool_size)
    seen = [pid for pid, rec in stats.records.items() if rec.index >= 0]
    want = n if fresh_per_step is None else fresh_per_step
    fresh = source.fresh(max(want, n - len(seen)), stats)  # never fewer candidates than picks
    fresh_ids = {p.id for p in fresh}
    return Candidates(fresh, [pid for pid in seen if pid not in fresh_ids])
