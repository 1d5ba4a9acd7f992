"""Length buckets for decode attention: how to cut a slot engine's running rows into
contiguous ranges that each attend over their own span.

A decode step's attention costs rows × span. With one span for every row (the longest
row's), a batch mixing long and short sequences (a long tail, resumed partial rollouts)
pays the longest span on every row. ``split_cost`` finds up to four contiguous ranges with
their own spans; ``SlotEngine`` re-sorts its rows by length when that order would save much.
"""

from __future__ import annotations


def split_cost(spans: list[int], a: int, b: int, depth: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Cheapest cut of rows ``[a, b)`` into contiguous ranges (up to ``2**depth``), cost = Σ rows × max span.

    A cut must save at least an eighth of the range's cost and leave 8+ rows on each side
    (every range is one more attention call per layer)."""
    whole = (b - a) * max(spans[a:b])
    if depth == 0 or b - a < 16:
        return whole, [(a, b, max(spans[a:b]))]
    prefix, suffix = [], [0] * (b - a)
    m = 0
    for s in spans[a:b]:
        m = max(m, s)
        prefix.append(m)
    m = 0
    for i in range(b - a - 1, -1, -1):
        m = max(m, spans[a + i])
        suffix[i] = m
    best, cut = whole, None
    for i in range(8, b - a - 7):
        c = i * prefix[i - 1] + (b - a - i) * suffix[i]
        if c < best:
            best, cut = c, a + i
    if cut is None or whole - best < whole / 8:
        return whole, [(a, b, max(spans[a:b]))]
    left, lb = split_cost(spans, a, cut, depth - 1)
    right, rb = split_cost(spans, cut, b, depth - 1)
    return left + right, lb + rb
