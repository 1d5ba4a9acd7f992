"""How queued sequences take rows of the slot engine's cache, and how finished ones leave
(``SlotEngine``'s admission; the engine's docstring says what each step does with them).

``Admission._admit`` empties the queue into free rows, cheapest source first: a resumed
sequence's parked cache or a kept prompt prefix is copied in (``_place_restores``); a fork
child copies its running sibling's rows (``_place_copies``); a continued sequence (ids appended
after its parked cache, ``state.continuation``) copies its cache in and prefills only the ids
past it (``_place_extensions``), unless the weights changed since that cache was computed; the
rest are prefill leaders, or followers that share a leader's prefill (same prompt, same fork
family). ``_free`` releases rows and moves the last running rows into the holes, so running
rows stay ``[0, n)``; ``_cached_kv`` copies a row's cache out (``pause(keep_cache=True)``, and a
finished ``keep_cache`` sequence's ``Completion.kv``).

``PrefixCache`` keeps the cached keys/values of recent prompts for ``keep_prefixes``.

``Admission`` is a mixin of ``SlotEngine`` and works on its state: ``forward`` (the
``LlamaForward``, which makes and grows the cache), ``_queue``, ``_rows``, ``_lens``, ``_kv``
(the ``SlotKV``), the per-row device tensors (``_pending``, ``_pos`` and the sampling settings,
``_row_state``), ``_prefixes``, ``_needed``, ``_order_dirty`` and ``stats``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from rollwise.engine.llama import SlotKV
from rollwise.engine.state import Sequence


class PrefixCache:
    """The cached keys/values (all positions but the last) of the last ``capacity`` prompts
    prefilled, least recently used dropped first; 0 keeps none."""

    def __init__(self) -> None:
        self.capacity = 0
        self._kept: OrderedDict[tuple[int, ...], list[torch.Tensor]] = OrderedDict()  # prompt -> cached rows

    def __len__(self) -> int:
        return len(self._kept)

    def resize(self, n: int) -> None:
        self.capacity = n
        while len(self._kept) > n:
            self._kept.popitem(last=False)

    def clear(self) -> None:
        self._kept.clear()

    def lookup(self, seq: Sequence) -> list[torch.Tensor] | None:
        """The kept prefix of a fresh sequence's prompt, if any (marked most recently used)."""
        if not self._kept or seq.tokens or len(seq.prompt_ids) < 2:
            return None
        key = tuple(seq.prompt_ids)
        cached = self._kept.get(key)
        if cached is not None:
            self._kept.move_to_end(key)
        return cached

    def remember(self, leaders: list[Sequence], kv: SlotKV) -> None:
        """Keep the prompt prefix of each fresh leader just prefilled into ``kv``."""
        if not self.capacity:
            return
        for seq in leaders:
            if seq.tokens or len(seq.prompt_ids) < 2:
                continue
            key = tuple(seq.prompt_ids)
            if key not in self._kept:
                self._kept[key] = kv.export_row(seq.row, len(seq.prompt_ids) - 1)
            self._kept.move_to_end(key)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)


class Admission:
    """Rows in and out of the slot cache (a ``SlotEngine`` mixin)."""

    def _ensure_cache(self) -> None:
        cap = self._kv.capacity if self._kv is not None else 0
        if self._needed <= cap:
            return
        new = min(self.max_len, -(-max(self._needed, 2 * cap) // 64) * 64)  # room to grow, in blocks of 64
        self.forward.ensure_rope(new)
        if self._kv is None:
            self._kv = self.forward.new_cache(self.max_batch_size, new)
        else:
            self._kv.grow(new)

    def _admit(self) -> tuple[int, list[Sequence], list[tuple[Sequence, int]], list[tuple[Sequence, int]]]:
        """Move queued sequences into free rows. Fork children with a running sibling are placed
        at once (they decode this step); the rest become prefill leaders, or followers that
        share a leader's prefill, or extensions that prefill past their parked cache. Returns
        (rows that decode, leaders, (follower, leader index), (extension, cached length))."""
        self._ensure_cache()
        free = self.max_batch_size - len(self._rows)
        copies, restores, hits, extensions, leaders, followers, lead_of = [], [], [], [], [], [], {}
        family_hit: dict[int, Sequence] = {}  # a fork family whose first member took a cached prefix
        while self._queue and free > 0:
            seq = self._queue.popleft()
            free -= 1
            if seq.parked is not None and self._parked_usable(seq):
                (restores if seq.parked[0].shape[2] == len(seq.ids) - 1 else extensions).append(seq)
                continue
            family = seq.family
            if family is not None:
                sibling = family.running()
                if sibling is not None:
                    copies.append((seq, sibling))
                    continue
                if id(family) in family_hit:
                    copies.append((seq, family_hit[id(family)]))
                    continue
                if family.same_ids and id(family) in lead_of:
                    followers.append((seq, lead_of[id(family)]))
                    continue
            cached = self._prefixes.lookup(seq)
            if cached is not None:
                seq.parked = cached
                hits.append(seq)
                if family is not None:
                    family_hit[id(family)] = seq
                continue
            if family is not None:
                lead_of[id(family)] = len(leaders)
            leaders.append(seq)
        # longest first, so prefill can cut them into chunks of similar length (see _run_model)
        order = sorted(range(len(leaders)), key=lambda i: -len(leaders[i].ids))
        rank = {old: new for new, old in enumerate(order)}
        leaders = [leaders[i] for i in order]
        followers = [(f, rank[i]) for f, i in followers]
        self._place_restores(restores)
        self._place_restores(hits, from_prefix_cache=True)
        self._place_copies([(s, src.row) for s, src in copies])  # after the hits: they may copy from one
        n_decode = len(self._rows)
        self._place(leaders, [len(s.ids) for s in leaders])
        self._place([f for f, _ in followers], [len(f.ids) for f, _ in followers])
        extensions = self._place_extensions(extensions)
        return n_decode, leaders, followers, extensions

    def _parked_usable(self, seq: Sequence) -> bool:
        """Whether a resumed sequence's parked cache is copied in. One that covers all its ids but
        the last is, always: after a weight update its prefix stays the old policy's (an in-flight
        update, ``pause(keep_cache=True)``). One that covers a prefix (ids appended since) only if
        the weights have not changed since it was computed; else it is dropped and the sequence
        prefilled whole (``stats.reprefill_tokens``), as the new policy would have it."""
        if seq.parked[0].shape[2] == len(seq.ids) - 1 or seq.cache_version == self.version:
            return True
        seq.parked, seq.cache_version, seq.recompute = None, None, True
        return False

    def _place(self, seqs: list[Sequence], lens: list[int], computed: bool = True) -> None:
        """Append running rows for ``seqs`` with ``lens`` cached positions and their sampling settings.
        ``computed``: their cached positions are (being) computed by the current weights."""
        if not seqs:
            return
        r0 = len(self._rows)
        for i, seq in enumerate(seqs):
            seq.row = r0 + i
            if computed:
                seq.cache_version = self.version
        self._order_dirty = True
        self._rows += seqs
        self._lens += lens
        self._pos[r0 : r0 + len(seqs)] = torch.tensor(lens, device=self.device)
        self._write_params(r0, seqs)

    def _write_params(self, r0: int, seqs: list[Sequence]) -> None:
        """Sampling settings of ``seqs`` into the device rows from ``r0``."""
        rows, dev = slice(r0, r0 + len(seqs)), self.device
        params = [s.params for s in seqs]
        temperature = [p.temperature if p.temperature > 0 else 1.0 for p in params]  # greedy rows ignore it
        self._temperature[rows] = torch.tensor(temperature, device=dev)
        self._top_k[rows] = torch.tensor([p.top_k for p in params], device=dev)
        self._top_p[rows] = torch.tensor([p.top_p for p in params], device=dev)
        self._greedy[rows] = torch.tensor([p.temperature == 0 for p in params], device=dev)

    def _place_copies(self, pairs: list[tuple[Sequence, int]]) -> None:
        """Admit fork children: copy the shared prefix from running row ``src``; each re-feeds its last id."""
        if not pairs:
            return
        lens = [s.family.shared_len for s, _ in pairs]
        r0 = len(self._rows)
        self._kv.copy_rows([src for _, src in pairs], list(range(r0, r0 + len(pairs))), max(lens))
        for s, src in pairs:
            s.cache_version = self._rows[src].cache_version
        self._place([s for s, _ in pairs], lens, computed=False)
        self._pending[r0 : r0 + len(pairs)] = torch.tensor([s.ids[-1] for s, _ in pairs], device=self.device)
        self.stats.prefix_tokens_shared += sum(lens)
        self.stats.prefill_tokens += sum(1 for s, _ in pairs if not s.tokens)  # a prompt's last token, again

    def _place_restores(self, seqs: list[Sequence], from_prefix_cache: bool = False) -> None:
        """Admit resumed sequences (or fresh ones whose prompt prefix is kept) with their parked
        cache: copy it in; each re-feeds its last id."""
        if not seqs:
            return
        r0 = len(self._rows)
        lens = [s.parked[0].shape[2] for s in seqs]
        for i, seq in enumerate(seqs):
            self._kv.import_row(r0 + i, seq.parked)
            seq.parked = None
        self._place(seqs, lens, computed=from_prefix_cache)  # a resumed cache keeps the version that computed it
        self._pending[r0 : r0 + len(seqs)] = torch.tensor([s.ids[-1] for s in seqs], device=self.device)
        if from_prefix_cache:
            self.stats.prefix_cache_hits += len(seqs)
            self.stats.prefix_cache_tokens += sum(lens)
            self.stats.prefill_tokens += len(seqs)  # each prompt's last token, fed as a decode row
        else:
            self.stats.restored_tokens += sum(lens)

    def _place_extensions(self, seqs: list[Sequence]) -> list[tuple[Sequence, int]]:
        """Admit continued sequences: copy each one's parked cache (a prefix of its ids) into its
        row; ``Decoding._prefill_extensions`` prefills the ids past it this step. Returns
        (sequence, cached length) in row order, by cached length so equal ones prefill together."""
        pairs = sorted(((s, s.parked[0].shape[2]) for s in seqs), key=lambda p: p[1])
        r0 = len(self._rows)
        for i, (seq, _) in enumerate(pairs):
            self._kv.import_row(r0 + i, seq.parked)
            seq.parked = None
        self._place([s for s, _ in pairs], [len(s.ids) for s, _ in pairs])  # same version (_parked_usable)
        self.stats.restored_tokens += sum(n for _, n in pairs)
        return pairs

    def _cached_kv(self, seq: Sequence) -> tuple[list[torch.Tensor] | None, int | None]:
        """A copy of a running ``seq``'s cached keys/values (``SlotKV.export_row``: its ids but the
        last, which is fed at its next step) and the oldest policy version among them; (None,
        None) when it has no row."""
        if seq.row is None:
            return None, None
        return self._kv.export_row(seq.row, self._lens[seq.row]), seq.cache_version

    def _free(self, rows: list[int]) -> None:
        """Release ``rows``; the last running rows move into the holes so rows stay ``[0, n)``."""
        if not rows:
            return
        gone = set(rows)
        for r in gone:
            self._rows[r].row = None
        n = len(self._rows)
        keep = n - len(gone)
        holes = [r for r in sorted(gone) if r < keep]
        movers = [r for r in range(keep, n) if r not in gone]
        if holes:
            self._order_dirty = True
            self._kv.copy_rows(movers, holes, max(self._lens[r] for r in movers))
            src, dst = torch.tensor(movers, device=self.device), torch.tensor(holes, device=self.device)
            for t in self._row_state:
                t[dst] = t[src]
            for h, m in zip(holes, movers):
                self._rows[h], self._lens[h] = self._rows[m], self._lens[m]
                self._rows[h].row = h
        del self._rows[keep:], self._lens[keep:]
