"""Engine v2: continuous batching over a slot KV cache the engine owns; fork; pause/resume.

The v1 ``Engine``'s contract plus branching (``engine/protocol.py``, ``BranchingEngine``):
``submit``, ``step``, ``run_until``, ``generate``, ``load_weights``, ``stats``, ``version``; plus
``peek``, ``fork``, ``pause``, ``resume``, ``abort`` and ``keep_prefixes``. It sees token ids and sampling settings, never tasks or rewards.

How it works:

- **Slots.** Keys/values live in a ``SlotKV`` preallocated per layer as
  ``[max_batch_size, n_kv_heads, capacity, head_dim]`` (model device and dtype). Running
  sequences occupy rows ``0..n-1``; when one finishes its slot is freed in the same step and
  the last row moves into the hole (one copy of that row's keys/values), so every decode
  step runs over a dense ``[:n]`` slice and never computes a finished row.
- **One step** = admit queued requests into free slots (prefill them together, right-padded,
  and sample their first token from the prefill logits) + one decode token for every row
  that was already running. Every running sequence gets exactly one token per step. The
  host syncs once per step (the sampled ids and log-probs, one ``.tolist()``).
- **Sampling** is v1's: per-request ``torch.Generator`` (seeded by ``SamplingParams.seed`` or
  from the engine's seed at submit, exactly as v1 draws it) and Gumbel-max over the
  filtered log-probs, so a request's tokens do not depend on its batch-mates beyond float
  effects of batch shape, and equal v1's for the same seed.
- **Fork** (``fork(handle, n)``): the sequence is replaced by ``n`` children that inherit its
  prompt, tokens, log-probs and versions; child ``i`` samples with its own generator seeded
  ``child_seed(parent_seed, i)``. A running parent's first child keeps its slot; the others
  get copies of its cached rows (never recomputed). A queued parent's children are prefilled
  once per admission wave: one leader row is computed, the others copy its rows and sample
  their first token from the same logits. Children that find no free slot wait in front of
  the queue and copy from a running sibling when admitted (re-prefilled only if none is left).
  A running child re-feeds the parent's last sampled token in its own row (that token was
  never in the parent's cache), as vLLM does for a full prefix-cache hit.
- **Pause/resume**: ``pause`` frees the slots and returns ``PartialState`` records (ids,
  log-probs, versions, params, seed and the generator's state); ``resume`` queues them and
  re-prefills prompt + completion on admission (``stats.reprefill_tokens``), so a sequence
  resumed under new weights continues exactly as the new policy would. ``pause(...,
  keep_cache=True)`` also copies out each running sequence's cached keys/values, and
  ``resume`` copies them back instead of recomputing (``stats.restored_tokens``): cheaper,
  but after a weight update the prefix's keys/values are the old policy's (an in-flight
  weight update, as PipelineRL does; the behaviour log-probs record what was sampled).
- **Prompt prefixes** (``keep_prefixes(n)``): the engine keeps the cached keys/values of the
  last ``n`` prompts it prefilled (all positions but the last); a fresh request for one of
  them later copies that prefix in and feeds only the prompt's last token
  (``stats.prefix_cache_hits``, ``stats.prefix_cache_tokens``) instead of prefilling the prompt
  again — a controller's extra rounds for prompts already sampled this step (XRPO, DARS).
  ``load_weights`` empties it: a prefix computed by older weights is never reused.

Forked parents and paused handles never produce a ``Completion``; children and resumed
sequences get new handles.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

import torch

from rollwise.engine.buckets import split_cost
from rollwise.engine.engine import Completion, EngineLoop, Request
from rollwise.engine.llama import LlamaForward, SlotKV
from rollwise.engine.sampling import SamplingParams, filtered_logprobs, gumbel_pick
from rollwise.engine.state import ForkFamily, PartialState, Sequence, SequenceView, SlotEngineStats, child_seed


class SlotEngine(EngineLoop):
    """Continuous batching with fork and pause/resume for Llama-family HF models (CPU or one GPU).

    ``max_batch_size`` is the number of slots (concurrent sequences). ``max_len`` bounds
    prompt + ``max_new_tokens`` of any request (default: the model's
    ``max_position_embeddings``); the cache grows to what submitted requests need, up to it.
    ``share_prefix_min``: leaders prefilled together that begin with at least this many equal ids
    (different prompts after one system prompt) prefill that prefix once (0 = never).
    Raises ``UnsupportedModelError`` for other architectures (use the v1 ``Engine``).
    """

    def __init__(self, model, *, pad_token_id: int, max_batch_size: int = 64, seed: int = 0,
                 max_len: int | None = None, share_prefix_min: int = 16):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size (the number of slots) must be >= 1, got {max_batch_size}")
        self.forward = LlamaForward(model)
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.max_len = max_len or model.config.max_position_embeddings
        self.share_prefix_min = share_prefix_min
        self.version = 0
        self.stats = SlotEngineStats(slots=max_batch_size)
        self._seeder = torch.Generator().manual_seed(seed)
        self._next_handle = 0
        self._queue: deque[Sequence] = deque()
        self._live: dict[int, Sequence] = {}  # handle -> queued or running sequence
        self._finished: dict[int, Completion] = {}
        self._early: list[Completion] = []  # finished outside a step (a fork child forced to a stop token)
        self._sorted_at = -8  # stats.steps at the last row sort
        self._order_dirty = False  # rows were added or moved since the order was last judged
        self._rows: list[Sequence] = []  # running sequences; row r uses cache row r
        self._lens: list[int] = []  # cached positions per row
        self._kv: SlotKV | None = None
        self._prefixes: OrderedDict[tuple[int, ...], list[torch.Tensor]] = OrderedDict()  # prompt -> cached rows
        self._prefix_capacity = 0  # keep_prefixes(n): prompts kept; 0 = none
        self._needed = 0  # longest prompt + max_new_tokens accepted so far
        S, dev = max_batch_size, self.device
        self._pending = torch.zeros(S, dtype=torch.long, device=dev)  # token each row feeds next
        self._pos = torch.zeros(S, dtype=torch.long, device=dev)  # = _lens, on the device
        self._temperature = torch.ones(S, device=dev)
        self._top_k = torch.zeros(S, dtype=torch.long, device=dev)
        self._top_p = torch.ones(S, device=dev)
        self._greedy = torch.zeros(S, dtype=torch.bool, device=dev)
        self._row_state = (self._pending, self._pos, self._temperature, self._top_k, self._top_p, self._greedy)
        self._uniform = torch.empty(S, model.lm_head.weight.shape[0], device=dev)  # Gumbel draws

    @property
    def device(self) -> torch.device:
        return self.forward.device

    # -- contract -------------------------------------------------------------------------
    def submit(self, requests: list[Request]) -> list[int]:
        for req in requests:
            if not req.prompt_ids:
                raise ValueError("engine request has an empty prompt (prompt_ids must hold at least one token)")
            self._check_fits(len(req.prompt_ids), req.params)
        handles, families = [], {}
        for req in requests:
            seed = req.params.seed
            if seed is None:  # drawn as v1 draws it, so an engine seed gives v1's results
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seeder))
            seq = self._new_seq(list(req.prompt_ids), req.params, seed)
            self._queue.append(seq)
            handles.append(seq.handle)
            if len(seq.prompt_ids) > 1:
                families.setdefault(tuple(seq.prompt_ids), []).append(seq)
        self._share_prompts(families.values())
        return handles

    @staticmethod
    def _share_prompts(groups) -> None:
        """Requests submitted together with the same prompt (a GRPO group) become one fork family:
        the prompt is prefilled once and the others copy its cached rows (``_admit``) — chat
        prompts are often longer than the completions, so prefilling each sample's copy would be
        most of the prefill work."""
        for seqs in groups:
            if len(seqs) < 2:
                continue
            family = ForkFamily(shared_len=len(seqs[0].prompt_ids) - 1)
            for seq in seqs:
                seq.family = family
                family.members.append(seq)

    @torch.no_grad()
    def step(self) -> list[Completion]:
        """Admit queued requests into free slots and advance every running sequence by one token."""
        start = time.perf_counter()
        finished, self._early = self._early, []
        n_decode, leaders, followers = self._admit()
        if self._rows:
            logits = self._run_model(n_decode, leaders, followers)
            self._remember(leaders)
            finished += self._sample(logits)
            self.stats.steps += 1
        self.stats.wall_seconds += time.perf_counter() - start
        return finished

    def _busy(self) -> bool:
        return bool(self._queue) or bool(self._rows) or bool(self._early)

    def _weights_changed(self) -> None:
        self.forward.refresh()
        self._prefixes.clear()  # computed by the old weights

    def keep_prefixes(self, n: int) -> None:
        """Keep the cached prompt prefixes of the last ``n`` prompts prefilled (least recently used
        dropped first; 0 = keep none and forget what is kept), so later requests for the same
        prompt under the same weights skip its prefill."""
        if n < 0:
            raise ValueError(f"keep_prefixes needs n >= 0, got {n}")
        self._prefix_capacity = n
        while len(self._prefixes) > n:
            self._prefixes.popitem(last=False)

    def peek(self, handle: int) -> SequenceView:
        """The tokens so far of a queued or running sequence (and its latest top candidates)."""
        seq = self._get(handle)
        return SequenceView(seq.tokens, seq.logprobs, seq.versions, seq.candidates, seq.hidden)

    @torch.no_grad()
    def fork(self, handle: int, n: int, params: list[SamplingParams] | None = None,
             replace_last: list[int | None] | None = None) -> list[int]:
        """Replace a queued or running sequence by ``n`` children sharing its prefix; return their handles.

        Children keep the parent's sampling settings unless ``params`` gives one per child
        (e.g. per-branch budgets); a child's seed is always ``child_seed(parent seed, index)``.
        ``replace_last[i]`` (a token among the parent's recorded ``candidates``, or None)
        makes child ``i`` continue from that token instead of the parent's last sampled one:
        branching into an alternative at the latest position (LATR). The replaced token keeps
        its log-prob under the sampling distribution and is listed in ``forced``. Needs a
        running parent sampled with ``top_candidates > 0``.
        """
        if n < 1:
            raise ValueError(f"fork needs n >= 1, got {n}")
        parent = self._get(handle)
        if params is None:
            params = [parent.params] * n
        elif len(params) != n:
            raise ValueError(f"fork got {len(params)} sampling settings for {n} children")
        replace_last = list(replace_last) if replace_last is not None else [None] * n
        if len(replace_last) != n:
            raise ValueError(f"fork got {len(replace_last)} replace_last entries for {n} children")
        alternatives = dict(parent.candidates or ())
        for tok in replace_last:
            if tok is None:
                continue
            if parent.row is None or not parent.tokens:
                raise ValueError("fork(replace_last=...) needs a running parent that has sampled a token")
            if tok not in alternatives:
                raise ValueError(f"replace_last token {tok} is not among the parent's recorded candidates "
                                 "(submit with SamplingParams(top_candidates=k))")
        for p in params:
            if len(parent.tokens) >= p.max_new_tokens:
                raise ValueError(f"a fork child's max_new_tokens ({p.max_new_tokens}) must exceed the "
                                 f"{len(parent.tokens)} tokens already sampled")
            self._check_fits(len(parent.prompt_ids), p)
        self._take(handle)
        family = ForkFamily(shared_len=len(parent.ids) - 1, same_ids=all(t is None for t in replace_last))
        handles = []
        for i, (p, tok) in enumerate(zip(params, replace_last)):
            child = self._new_seq(
                parent.prompt_ids, p, child_seed(parent.seed, i), tokens=list(parent.tokens),
                logprobs=list(parent.logprobs), versions=list(parent.versions),
                recompute=parent.recompute or parent.row is not None, forced=list(parent.forced),
                candidates=parent.candidates,
            )
            handles.append(child.handle)
            if tok is not None and tok != parent.tokens[-1]:
                child.tokens[-1], child.logprobs[-1] = tok, alternatives[tok]
                child.forced.append(len(child.tokens) - 1)
                if tok in p.stop_token_ids:  # forced to stop: finished now, reported by the next step()
                    del self._live[child.handle]
                    self._early.append(self._completion(child, "stop"))
                    continue
            child.family = family
            family.members.append(child)
        children = family.members
        if parent.row is None:  # still queued: the children take its place in line
            queue = list(self._queue)
            at = queue.index(parent)
            self._queue = deque(queue[:at] + children + queue[at + 1 :])
        elif not children:  # every child stopped at once
            self._free([parent.row])
        else:
            row = parent.row
            assert self._lens[row] == family.shared_len
            children[0].row, self._rows[row], parent.row = row, children[0], None
            self._write_params(row, children[:1])
            self._pending[row] = children[0].tokens[-1]  # the first child may continue from another token
            free = self.max_batch_size - len(self._rows)
            self._place_copies([(c, row) for c in children[1 : 1 + free]])
            self._queue.extendleft(reversed(children[1 + free :]))  # first in line
        return handles

    def pause(self, handles: list[int], keep_cache: bool = False) -> list[PartialState]:
        """Stop these sequences, free their slots, and return their states (in order).

        ``keep_cache``: running sequences' states carry a copy of their cached keys/values
        (``PartialState.kv``), which ``resume`` reuses instead of recomputing the prefix."""
        for h in handles:
            self._get(h)  # all or nothing
        if len(set(handles)) != len(handles):
            raise ValueError("pause got the same handle twice")
        states, freed = [], []
        for h in handles:
            seq = self._take(h)
            if seq.row is None:
                self._queue.remove(seq)
            else:
                freed.append(seq.row)
            states.append(PartialState(
                prompt_ids=list(seq.prompt_ids), token_ids=list(seq.tokens), logprobs=list(seq.logprobs),
                versions=list(seq.versions), params=seq.params, seed=seq.seed,
                generator_state=seq.generator.get_state(), forced=list(seq.forced),
                kv=self._kv.export_row(seq.row, self._lens[seq.row]) if keep_cache and seq.row is not None else None,
                kv_version=self.version if keep_cache and seq.row is not None else None,
            ))
        self._free(freed)
        return states

    def abort(self, handles: list[int]) -> None:
        """End these sequences for good (online pruning): slots freed, no completion, nothing to resume.
        ``stats.aborted_tokens`` counts what they had sampled."""
        states = self.pause(handles)
        self.stats.aborted += len(states)
        self.stats.aborted_tokens += sum(len(st.token_ids) for st in states)

    def resume(self, states: list[PartialState]) -> list[int]:
        """Queue paused sequences to continue where they stopped; return their new handles."""
        for st in states:
            if not st.prompt_ids:
                raise ValueError("cannot resume a state with an empty prompt")
            if not len(st.token_ids) == len(st.logprobs) == len(st.versions):
                raise ValueError("resume: token_ids, logprobs and versions must have equal lengths")
            if len(st.token_ids) >= st.params.max_new_tokens:
                raise ValueError("resume: this state already holds max_new_tokens tokens")
            self._check_fits(len(st.prompt_ids), st.params)
        handles = []
        for st in states:
            gen = torch.Generator(device=self.device)
            gen.set_state(st.generator_state)
            seq = self._new_seq(list(st.prompt_ids), st.params, st.seed, generator=gen, tokens=list(st.token_ids),
                                logprobs=list(st.logprobs), versions=list(st.versions), recompute=st.kv is None,
                                forced=list(st.forced), parked=st.kv)
            if st.kv is not None and st.kv[0].shape[2] != len(seq.ids) - 1:
                raise ValueError("resume: the state's cached keys/values do not match its ids")
            self._queue.append(seq)
            handles.append(seq.handle)
        return handles

    # -- bookkeeping ----------------------------------------------------------------------
    def _new_seq(self, prompt_ids, params, seed, generator=None, **kw) -> Sequence:
        if generator is None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        seq = Sequence(self._next_handle, prompt_ids, params, seed, generator, **kw)
        self._live[seq.handle] = seq
        self._next_handle += 1
        return seq

    def _get(self, handle: int) -> Sequence:
        if handle not in self._live:
            raise ValueError(f"handle {handle} is not queued or running (finished, paused, forked or unknown)")
        return self._live[handle]

    def _take(self, handle: int) -> Sequence:
        return self._live.pop(self._get(handle).handle)

    def _check_fits(self, prompt_len: int, params: SamplingParams) -> None:
        need = prompt_len + params.max_new_tokens
        if need > self.max_len:
            raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({params.max_new_tokens}) = {need} "
                             f"exceeds the engine's max_len {self.max_len}")
        self._needed = max(self._needed, need)

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

    def _place(self, seqs: list[Sequence], lens: list[int]) -> None:
        """Append running rows for ``seqs`` with ``lens`` cached positions and their sampling settings."""
        if not seqs:
            return
        r0 = len(self._rows)
        for i, seq in enumerate(seqs):
            seq.row = r0 + i
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
        self._place([s for s, _ in pairs], lens)
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
        self._place(seqs, lens)
        self._pending[r0 : r0 + len(seqs)] = torch.tensor([s.ids[-1] for s in seqs], device=self.device)
        if from_prefix_cache:
            self.stats.prefix_cache_hits += len(seqs)
            self.stats.prefix_cache_tokens += sum(lens)
            self.stats.prefill_tokens += len(seqs)  # each prompt's last token, fed as a decode row
        else:
            self.stats.restored_tokens += sum(lens)

    def _cached_prefix(self, seq: Sequence) -> list[torch.Tensor] | None:
        """The kept prefix of a fresh sequence's prompt, if any (marked most recently used)."""
        if not self._prefixes or seq.tokens or len(seq.prompt_ids) < 2:
            return None
        key = tuple(seq.prompt_ids)
        cached = self._prefixes.get(key)
        if cached is not None:
            self._prefixes.move_to_end(key)
        return cached

    def _remember(self, leaders: list[Sequence]) -> None:
        """Keep the prompt prefix of each fresh leader just prefilled (``keep_prefixes``)."""
        if not self._prefix_capacity:
            return
        for seq in leaders:
            if seq.tokens or len(seq.prompt_ids) < 2:
                continue
            key = tuple(seq.prompt_ids)
            if key not in self._prefixes:
                self._prefixes[key] = self._kv.export_row(seq.row, len(seq.prompt_ids) - 1)
            self._prefixes.move_to_end(key)
        while len(self._prefixes) > self._prefix_capacity:
            self._prefixes.popitem(last=False)

    def _admit(self) -> tuple[int, list[Sequence], list[tuple[Sequence, int]]]:
        """Move queued sequences into free rows. Fork children with a running sibling are placed
        at once (they decode this step); the rest become prefill leaders, or followers that
        share a leader's prefill. Returns (rows that decode, leaders, (follower, leader index))."""
        self._ensure_cache()
        free = self.max_batch_size - len(self._rows)
        copies, restores, hits, leaders, followers, lead_of = [], [], [], [], [], {}
        family_hit: dict[int, Sequence] = {}  # a fork family whose first member took a cached prefix
        while self._queue and free > 0:
            seq = self._queue.popleft()
            free -= 1
            if seq.parked is not None:
                restores.append(seq)
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
            cached = self._cached_prefix(seq)
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
        return n_decode, leaders, followers

    # -- model and sampling ---------------------------------------------------------------
    def _run_model(self, n_decode: int, leaders: list[Sequence], followers: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Decode rows ``[0, n_decode)``, prefill the leaders; return next-token logits for every row [n, V]."""
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
        self._hidden = torch.cat(hidden) if self.forward.capture_hidden else None  # [n, D], rows as the logits
        return (torch.cat(parts) if len(parts) > 1 else parts[0]).float()

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

    @staticmethod
    def _completion(seq: Sequence, reason: str) -> Completion:
        return Completion(handle=seq.handle, prompt_ids=list(seq.prompt_ids), token_ids=seq.tokens,
                          logprobs=seq.logprobs, versions=seq.versions, finish_reason=reason, forced=seq.forced,
                          hidden=seq.hidden)

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
