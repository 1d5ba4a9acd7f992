"""One step over the slot engine's running rows: the model forward (one decode token per
running row, the admitted leaders prefilled in chunks of similar length, a prefix they all
share prefilled once, continued sequences prefilled past their copied-in cache), length
buckets for decode attention, and sampling (one host sync), after which finished rows leave
(``SlotEngine.step``; a ``keep_cache`` one with a copy of its cache).

``Decoding`` is a mixin of ``SlotEngine`` and works on its state: ``forward`` (the
``LlamaForward``), ``_rows``, ``_lens``, ``_kv``, the per-row device tensors (``_pending``,
``_pos``, the sampling settings, ``_row_state``), ``_uniform`` (Gumbel draws), ``_live``,
``_hidden``, ``_sorted_at``, ``_order_dirty``, ``version`` and ``stats``.
"""

from __future__ import annotations

import torch

from rollwise.engine.buckets import split_cost
from rollwise.engine.engine import Completion
from rollwise.engine.sampling import filtered_logprobs, gumbel_pick
from rollwise.engine.state import Sequence


class Decoding:
    """Forward, bucketing and sampling over the running rows (a ``SlotEngine`` mixin)."""

    def _run_model(self, n_decode: int, leaders: list[Sequence], followers: list[tuple[Sequence, int]],
                   extensions: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Decode rows ``[0, n_decode)``, prefill the leaders, then the extensions past their cached
        length; return next-token logits for every row [n, V]."""
        parts, hidden = [], []
        self.forward.capture_hidden = any(s.params.keep_hidden for s in self._rows)
        if n_decode:
            buckets = self._buckets(n_decode)
            parts.append(self.forward.decode(self._kv, self._pending[:n_decode], self._pos[:n_decode], buckets))
            hidden.append(self.forward.hidden)
            self._pos[:n_decode] += 1
            self._lens[:n_decode] = [n + 1 for n in self._lens[:n_decode]]
            self.stats.forward_calls += 1
        if leaders:
            seqs = [s.ids for s in leaders]  # longest first (_admit)
            lens = [len(s) for s in seqs]
            start = self._prefill_shared_prefix(seqs, n_decode)
            # attention in a prefill costs rows × width²: a leader under half the chunk's width starts a new chunk
            chunks, a = [], 0
            for i in range(1, len(lens) + 1):
                if i == len(lens) or 2 * (lens[i] - start) < lens[a] - start:
                    chunks.append((a, i))
                    a = i
            logits = []
            for a, b in chunks:
                width = lens[a] - start
                ids = torch.tensor([s[start:] + [self.pad_token_id] * (width - len(s) + start) for s in seqs[a:b]],
                                   device=self.device)
                logits.append(self.forward.prefill(self._kv, ids, [n - start for n in lens[a:b]], n_decode + a, start))
                hidden.append(self.forward.hidden)
            logits = torch.cat(logits) if len(logits) > 1 else logits[0]
            self.stats.forward_calls += len(chunks)
            self.stats.prefill_tokens += sum(lens) - start * len(lens)
            self.stats.reprefill_tokens += sum(n for s, n in zip(leaders, lens) if s.recompute)
            if followers:  # same prompt as their leader: copy its rows, sample from its logits
                src = [n_decode + i for _, i in followers]
                self._kv.copy_rows(src, [f.row for f, _ in followers], max(lens[i] for _, i in followers))
                self.stats.prefix_tokens_shared += sum(lens[i] for _, i in followers)
                pick = torch.tensor(list(range(len(leaders))) + [i for _, i in followers], device=self.device)
                logits = logits[pick]
                if self.forward.capture_hidden:
                    hidden[-len(chunks):] = [torch.cat(hidden[-len(chunks):])[pick]]
            parts.append(logits)
        if extensions:
            parts.append(self._prefill_extensions(extensions, hidden))
        self._hidden = torch.cat(hidden) if self.forward.capture_hidden else None  # [n, D], rows as the logits
        return (torch.cat(parts) if len(parts) > 1 else parts[0]).float()

    def _prefill_extensions(self, pairs: list[tuple[Sequence, int]], hidden: list[torch.Tensor]) -> torch.Tensor:
        """Prefill each continued sequence's ids past its cached length ``L`` (rows hold ``[0, L)``:
        ``Admission._place_extensions``), one call per run of equal ``L``; return their logits [m, V]
        and append the hidden states to ``hidden``."""
        logits, a = [], 0
        for b in range(1, len(pairs) + 1):
            if b < len(pairs) and pairs[b][1] == pairs[a][1]:
                continue
            start = pairs[a][1]
            suffixes = [s.ids[start:] for s, _ in pairs[a:b]]
            width = max(map(len, suffixes))
            ids = torch.tensor([x + [self.pad_token_id] * (width - len(x)) for x in suffixes], device=self.device)
            logits.append(self.forward.prefill(self._kv, ids, [len(x) for x in suffixes], pairs[a][0].row, start))
            hidden.append(self.forward.hidden)
            self.stats.forward_calls += 1
            self.stats.prefill_tokens += sum(map(len, suffixes))
            a = b
        return torch.cat(logits) if len(logits) > 1 else logits[0]

    def _prefill_shared_prefix(self, seqs: list[list[int]], row0: int) -> int:
        """When the leaders ``seqs`` (rows ``row0..``) begin with the same ``share_prefix_min`` or
        more ids (a chat template's system prompt, few-shot examples), prefill that common prefix
        once into the first row and copy it to the others; return its length (0 = nothing shared).
        Each leader keeps at least its last id to prefill, so every row gets its own logits."""
        if len(seqs) < 2 or not self.share_prefix_min:
            return 0
        first, limit = seqs[0], min(len(s) for s in seqs) - 1
        n = 0
        while n < limit and all(s[n] == first[n] for s in seqs):
            n += 1
        if n < self.share_prefix_min:
            return 0
        self.forward.prefill(self._kv, torch.tensor([first[:n]], device=self.device), [n], row0)  # logits unused
        self._kv.copy_rows([row0] * (len(seqs) - 1), list(range(row0 + 1, row0 + len(seqs))), n)
        self.stats.forward_calls += 1
        self.stats.prefill_tokens += n
        self.stats.prefix_tokens_shared += n * (len(seqs) - 1)
        return n

    # -- length buckets for decode attention (engine/buckets.py) ------------------------------
    def _buckets(self, n: int) -> list[tuple[int, int, int]]:
        """Contiguous row ranges with their own spans; when rows were added or moved since the
        order was last judged and sorting them by length would save a sixth or more of the
        attention, re-sort them first (at most every 8 steps: a sort copies their cache rows)."""
        spans = [length + 1 for length in self._lens[:n]]  # each row attends over [0, its position]
        cost, buckets = split_cost(spans, 0, n, depth=2)
        if self._order_dirty and n >= 32 and self.stats.steps - self._sorted_at >= 8:
            self._order_dirty = False  # every row gains one token per step: the order holds until rows change
            best, _ = split_cost(sorted(spans, reverse=True), 0, n, depth=2)
            if cost - best > 0.15 * cost:
                self._sort_rows(n)
                self._sorted_at = self.stats.steps
                spans = [length + 1 for length in self._lens[:n]]
                cost, buckets = split_cost(spans, 0, n, depth=2)
        return buckets

    def _sort_rows(self, n: int) -> None:
        """Reorder running rows ``[0, n)`` longest first: cache rows, row settings, bookkeeping."""
        order = sorted(range(n), key=lambda r: -self._lens[r])
        width = max(self._lens[:n])
        index = torch.tensor(order, device=self.device)
        for t in (*self._kv.k, *self._kv.v):
            t[:n, :, :width] = t[index, :, :width]
        for t in self._row_state:
            t[:n] = t[index]
        self._rows[:n] = [self._rows[r] for r in order]
        self._lens[:n] = [self._lens[r] for r in order]
        for r, seq in enumerate(self._rows[:n]):
            seq.row = r
        self.stats.row_sorts += 1

    # -- sampling ----------------------------------------------------------------------------
    def _sample(self, logits: torch.Tensor) -> list[Completion]:
        """Sample one token per row (one host sync), record it, and retire finished rows."""
        n, rows = logits.shape[0], self._rows
        if all(s.params.temperature == 0 or s.params.is_plain for s in rows):
            logprobs = logits.log_softmax(-1)  # the common case, without sorting the vocabulary
        else:
            logprobs = filtered_logprobs(logits, self._temperature[:n], self._top_k[:n], self._top_p[:n])
        uniform = self._uniform[:n]
        for i, seq in enumerate(rows):
            torch.rand(uniform.shape[1], generator=seq.generator, out=uniform[i])
        tokens, chosen = gumbel_pick(logits, logprobs, self._greedy[:n], uniform)
        self._pending[:n] = tokens
        token_list, logprob_list = torch.stack((tokens.double(), chosen.double())).tolist()
        self._record_candidates(rows, logprobs)
        if self._hidden is not None:
            for seq, h in zip(rows, self._hidden):
                if seq.params.keep_hidden:
                    seq.hidden = h.float().clone()
        self.stats.decode_tokens += n
        self.stats.padded_decode_slots += n
        self.stats.rows_per_step.append(n)
        done, finished = [], []
        for r, (seq, tok, lp) in enumerate(zip(rows, token_list, logprob_list)):
            tok = int(tok)
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(self.version)
            reason = "stop" if tok in seq.params.stop_token_ids else (
                "length" if len(seq.tokens) >= seq.params.max_new_tokens else None)
            if reason is not None:
                done.append(r)
                del self._live[seq.handle]
                finished.append(self._completion(seq, reason))
        self._free(done)
        return finished

    def _completion(self, seq: Sequence, reason: str) -> Completion:
        """``seq``'s result; with ``keep_cache``, a copy of its cache while it still holds its row
        (None for a fork child forced to a stop token: it never had one)."""
        kv, kv_version = self._cached_kv(seq) if seq.params.keep_cache else (None, None)
        return Completion(handle=seq.handle, prompt_ids=list(seq.prompt_ids), token_ids=seq.tokens,
                          logprobs=seq.logprobs, versions=seq.versions, finish_reason=reason, forced=seq.forced,
                          hidden=seq.hidden, kv=kv, kv_version=kv_version)

    def _record_candidates(self, rows: list[Sequence], logprobs: torch.Tensor) -> None:
        """Keep each asking row's ``top_candidates`` most likely tokens of this position (one more sync)."""
        want = [(r, s.params.top_candidates) for r, s in enumerate(rows) if s.params.top_candidates]
        if not want:
            return
        k = min(max(k for _, k in want), logprobs.shape[-1])
        at = torch.tensor([r for r, _ in want], device=logprobs.device)
        values, ids = logprobs[at].topk(k, dim=-1)
        for (r, kr), vs, ix in zip(want, values.tolist(), ids.tolist()):
            rows[r].candidates = [(i, v) for i, v in zip(ix[:kr], vs[:kr]) if v > float("-inf")]
