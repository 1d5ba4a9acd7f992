"""Engine v2: continuous batching over a slot KV cache the engine owns; fork; pause/resume.

The v1 ``Engine``'s contract plus branching (``engine/protocol.py``, ``BranchingEngine``):
``submit``, ``step``, ``run_until``, ``generate``, ``load_weights``, ``stats``, ``version``; plus
``peek``, ``fork``, ``pause``, ``resume``, ``abort`` and ``keep_prefixes``. It sees token ids and
sampling settings, never tasks or rewards.

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
- **Continue** (multi-turn episodes): a request with ``SamplingParams(keep_cache=True)``
  finishes with a copy of its cache (``Completion.kv``, ``kv_version``); the caller appends
  ids (a tool result) and resumes ``state.continuation(done, appended, ...)``, whose cache
  covers a prefix of the ids: it is copied back and only the last sampled id and the appended
  ones are prefilled (``stats.restored_tokens``, ``prefill_tokens``), never the conversation.
  The appended ids are ``forced`` (log-prob 0.0). If the weights changed since the cache was
  computed it is dropped and the conversation prefilled whole (``stats.reprefill_tokens``).
- **Prompt prefixes** (``keep_prefixes(n)``): the engine keeps the cached keys/values of the
  last ``n`` prompts it prefilled (all positions but the last); a fresh request for one of
  them later copies that prefix in and feeds only the prompt's last token
  (``stats.prefix_cache_hits``, ``stats.prefix_cache_tokens``) instead of prefilling the prompt
  again — a controller's extra rounds for prompts already sampled this step (XRPO, DARS).
  ``load_weights`` empties it: a prefix computed by older weights is never reused.

Forked parents and paused handles never produce a ``Completion``; children and resumed
sequences get new handles.

This module holds the contract and the sequences' bookkeeping; how queued sequences take rows
is ``engine/admission.py``, and one step's forward and sampling ``engine/decoding.py``.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from rollwise.engine.admission import Admission, PrefixCache
from rollwise.engine.decoding import Decoding
from rollwise.engine.engine import Completion, EngineLoop, Request
from rollwise.engine.llama import LlamaForward, SlotKV
from rollwise.engine.sampling import SamplingParams
from rollwise.engine.state import ForkFamily, PartialState, Sequence, SequenceView, SlotEngineStats, child_seed


class SlotEngine(Admission, Decoding, EngineLoop):
    """Continuous batching with fork and pause/resume for Llama-family HF models (CPU or one GPU).

    ``max_batch_size`` is the number of slots (concurrent sequences). ``max_len`` bounds
    prompt + ``max_new_tokens`` of any request (default: the model's
    ``max_position_embeddings``); the cache grows to what submitted requests need, up to it.
    ``share_prefix_min``: leaders prefilled together that begin with at least this many equal ids
    (different prompts after one system prompt) prefill that prefix once (0 = never).
    ``dtype``: the sampling precision (None = the model's own); another dtype makes the engine
    keep its own cast copy of the weights, refreshed at every ``load_weights`` (``LlamaForward``).
    Raises ``UnsupportedModelError`` for other architectures (use the v1 ``Engine``).
    """

    def __init__(self, model, *, pad_token_id: int, max_batch_size: int = 64, seed: int = 0,
                 max_len: int | None = None, share_prefix_min: int = 16, dtype: torch.dtype | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size (the number of slots) must be >= 1, got {max_batch_size}")
        self.forward = LlamaForward(model, dtype=dtype)
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
        self._prefixes = PrefixCache()  # keep_prefixes(n): the last n prompts' cached rows
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

    @property
    def dtype(self) -> torch.dtype:
        """The precision the engine samples in."""
        return self.forward.dtype

    def set_dtype(self, dtype: torch.dtype | None) -> None:
        """Sample in ``dtype`` from now on (None: the model's own), its weights cast anew; only
        between generations (no running row): the cache and kept prefixes are dropped."""
        if self._rows:
            raise RuntimeError("SlotEngine.set_dtype with sequences running; call it between generations")
        self.forward.set_dtype(dtype)
        self._kv = None  # reallocated in the new dtype at the next admission
        self._prefixes.clear()

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
        n_decode, leaders, followers, extensions = self._admit()
        if self._rows:
            logits = self._run_model(n_decode, leaders, followers, extensions)
            self._prefixes.remember(leaders, self._kv)
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
        self._prefixes.resize(n)

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
        params, replace_last, alternatives = self._fork_settings(parent, n, params, replace_last)
        self._take(handle)
        family = ForkFamily(shared_len=len(parent.ids) - 1, same_ids=all(t is None for t in replace_last))
        handles = []
        for i, (p, tok) in enumerate(zip(params, replace_last)):
            child = self._new_seq(
                parent.prompt_ids, p, child_seed(parent.seed, i), tokens=list(parent.tokens),
                logprobs=list(parent.logprobs), versions=list(parent.versions),
                recompute=parent.recompute or parent.row is not None, forced=list(parent.forced),
                candidates=parent.candidates, cache_version=parent.cache_version,
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
        self._seat_children(parent, family)
        return handles

    def _fork_settings(self, parent: Sequence, n: int, params: list[SamplingParams] | None,
                       replace_last: list[int | None] | None):
        """``fork``'s arguments checked against ``parent``: (one ``SamplingParams`` per child, one
        ``replace_last`` entry per child, the parent's recorded candidates as {id: logprob})."""
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
        return params, replace_last, alternatives

    def _seat_children(self, parent: Sequence, family: ForkFamily) -> None:
        """Put fork children where their parent was: in its place in the queue, or (running) the
        first in its row and the others in copies of it while slots are free, first in line after."""
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
            kv, kv_version = self._cached_kv(seq) if keep_cache else (None, None)
            states.append(PartialState(
                prompt_ids=list(seq.prompt_ids), token_ids=list(seq.tokens), logprobs=list(seq.logprobs),
                versions=list(seq.versions), params=seq.params, seed=seq.seed,
                generator_state=seq.generator.get_state(), forced=list(seq.forced), kv=kv, kv_version=kv_version,
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
        """Queue paused or continued sequences (``state.continuation``) to sample on; return their
        new handles.

        A state's ``kv`` may cover all its ids but the last (``pause(keep_cache=True)``: copied
        back, the last id re-fed) or a prefix of them (a finished ``keep_cache`` sequence with ids
        appended since: copied back and the ids past it prefilled, unless the weights changed
        since ``kv_version``; then it is prefilled whole). Without ``kv`` it is prefilled whole."""
        for st in states:
            if not st.prompt_ids:
                raise ValueError("cannot resume a state with an empty prompt")
            if not len(st.token_ids) == len(st.logprobs) == len(st.versions):
                raise ValueError("resume: token_ids, logprobs and versions must have equal lengths")
            if any(not 0 <= i < len(st.token_ids) for i in st.forced):
                raise ValueError(f"resume: forced positions {st.forced} must index token_ids ({len(st.token_ids)})")
            if len(st.token_ids) >= st.params.max_new_tokens:
                raise ValueError(f"resume: this state already holds {len(st.token_ids)} tokens (sampled or "
                                 f"appended), max_new_tokens is {st.params.max_new_tokens}")
            self._check_fits(len(st.prompt_ids), st.params)
            if st.kv is not None:
                self._check_kv(st.kv, len(st.prompt_ids) + len(st.token_ids))
        handles = []
        for st in states:
            gen = torch.Generator(device=self.device)
            if st.generator_state is None:
                gen.manual_seed(st.seed)
            else:
                gen.set_state(st.generator_state)
            seq = self._new_seq(list(st.prompt_ids), st.params, st.seed, generator=gen, tokens=list(st.token_ids),
                                logprobs=list(st.logprobs), versions=list(st.versions), recompute=st.kv is None,
                                forced=list(st.forced), parked=st.kv,
                                cache_version=st.kv_version if st.kv is not None else None)
            self._queue.append(seq)
            handles.append(seq.handle)
        return handles

    def _check_kv(self, kv: list[torch.Tensor], n_ids: int) -> None:
        """A resumed state's cache must be this model's and cover at most its ids but the last."""
        f = self.forward
        want = (2, f.n_kv_heads, kv[0].shape[2] if kv else 0, f.head_dim)
        if len(kv) != f.num_layers or any(tuple(t.shape) != want for t in kv):
            raise ValueError(f"resume: the state's cached keys/values are not this model's: want {f.num_layers} "
                             f"tensors of [2, n_kv_heads, L, head_dim] = {list(want)}, got "
                             f"{[list(t.shape) for t in kv[:2]]}{'...' if len(kv) > 2 else ''} ({len(kv)} tensors)")
        if want[2] > n_ids - 1:
            raise ValueError(f"resume: the state's cached keys/values cover {want[2]} positions but its ids "
                             f"(prompt + tokens) have {n_ids}: a cache covers at most all ids but the last "
                             f"({n_ids - 1}); was it made for other ids?")

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
