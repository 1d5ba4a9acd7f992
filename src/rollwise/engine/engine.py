"""The embedded engine (v1): batched sampling from any HF causal LM with a KV cache.

Contract (``engine/protocol.py``, ``TokenEngine``): ``submit(requests) -> handles``, ``step()``,
``run_until(condition)``, ``generate(requests)``, ``load_weights(...)``. It sees token ids and sampling settings,
never tasks or rewards. Every generated token comes with its log-probability under the
sampling distribution actually used (after temperature, top-k and top-p) and the policy
version that produced it.

v1 batches statically: up to ``max_batch_size`` queued requests are left-padded and
prefilled together, then decoded one token per ``step()`` until every row has finished.
Each request samples from its own ``torch.Generator`` (seeded by ``SamplingParams.seed``,
or from the engine's seed at submit time), so results do not depend on which other
requests share its batch up to floating-point effects of batch size.
Continuous batching, ``fork`` and ``pause``/``resume`` are engine v2's
(``rollwise.engine.slots.SlotEngine``, Llama-family models); v1 stays the fallback that
runs any HF causal LM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rollwise.engine.sampling import SamplingParams, sample_next


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Completion:
    """A finished request: sampled ids with their behaviour log-probs and policy versions."""

    handle: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "stop" | "length"
    forced: list[int] = field(default_factory=list)  # positions of tokens placed (fork, a continuation), not sampled
    hidden: object = None  # torch.Tensor [D]: final hidden state behind the last token (slot engine, keep_hidden)
    # slot engine, SamplingParams.keep_cache: a copy of the cached keys/values (one [2, n_kv_heads,
    # len(ids) - 1, head_dim] tensor per layer: every id but the last sampled one, never fed) and the
    # oldest policy version among them; ``state.continuation`` turns them into a state to resume
    kv: list | None = field(default=None, repr=False)
    kv_version: int | None = None


@dataclass
class EngineStats:
    prefill_tokens: int = 0  # prompt tokens run through the model (padding excluded)
    decode_tokens: int = 0  # sampled tokens kept in completions
    padded_decode_slots: int = 0  # decode-step rows computed, including finished rows
    forward_calls: int = 0
    wall_seconds: float = 0.0

    @property
    def occupancy(self) -> float:
        """Share of computed decode rows that produced a kept token."""
        return self.decode_tokens / self.padded_decode_slots if self.padded_decode_slots else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "padded_decode_slots": self.padded_decode_slots,
            "forward_calls": self.forward_calls,
            "occupancy": self.occupancy,
            "wall_seconds": self.wall_seconds,
        }


@dataclass
class _Batch:
    handles: list[int]
    requests: list[Request]
    generators: list[torch.Generator]
    cache: object
    attention_mask: torch.Tensor  # [B, T_so_far]
    next_positions: torch.Tensor  # [B]
    last_tokens: torch.Tensor | None = None  # [B] sampled at the previous step
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)  # policy version that sampled each token
    done: list[str | None] = field(default_factory=list)


class EngineLoop:
    """The part of the engine contract both engines share: drive ``step()`` and hand back results.

    Subclasses provide ``step()``, ``_busy()`` (work queued or running), ``model``, ``version``
    and ``_finished``; ``_weights_changed()`` lets one refresh views of the parameters.
    """

    def run_until(self, condition: Callable[[dict[int, Completion]], bool] | None = None) -> dict[int, Completion]:
        """Step until ``condition(finished)`` holds (default: nothing left to do); return and clear finished."""
        while self._busy():
            for c in self.step():
                self._finished[c.handle] = c
            if condition is not None and condition(self._finished):
                break
        done, self._finished = self._finished, {}
        return done

    def generate(self, requests: list[Request]) -> list[Completion]:
        """Submit, run to completion, and return completions in request order."""
        handles = self.submit(requests)
        done = self.run_until()
        return [done[h] for h in handles]

    def load_weights(self, source) -> int:
        """Take new weights (a state dict, or a model whose parameters are shared) and bump the version."""
        if isinstance(source, dict):
            self.model.load_state_dict(source)
        elif source is not self.model:
            self.model.load_state_dict(source.state_dict())
        self._weights_changed()
        self.version += 1
        return self.version

    def _weights_changed(self) -> None:
        pass


class Engine(EngineLoop):
    """Batched generation with a KV cache for one HF causal LM (CPU or one GPU).

    ``dtype``: the sampling precision (None = the model's own); another dtype makes the engine
    sample from its own copy of the model in that dtype, which ``load_weights`` refreshes from the
    trainer's model (``load_state_dict`` casts)."""

    def __init__(self, model, *, pad_token_id: int, max_batch_size: int = 64, seed: int = 0,
                 dtype: torch.dtype | None = None):
        self.source = model  # the trainer's model: set_dtype casts a copy of it
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self.version = 0
        self.stats = EngineStats()
        self._seeder = torch.Generator().manual_seed(seed)
        self._queue: list[tuple[int, Request, torch.Generator]] = []
        self._finished: dict[int, Completion] = {}
        self._batch: _Batch | None = None
        self._next_handle = 0
        if dtype is not None:
            self.set_dtype(dtype)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The precision the engine samples in."""
        return next(self.model.parameters()).dtype

    def set_dtype(self, dtype: torch.dtype | None) -> None:
        """Sample in ``dtype`` from now on (None: the trainer's model itself, shared); only between
        generations. Another dtype: a copy of the model cast to it, the trainer's never touched."""
        import copy

        if self._batch is not None:
            raise RuntimeError("Engine.set_dtype with a batch running; call it between generations")
        if dtype is None or dtype == self.source.dtype:
            self.model = self.source
            return
        copied = copy.deepcopy(self.source).to(dtype).eval()
        for p in copied.parameters():
            p.requires_grad_(False)
            p.grad = None
        self.model = copied

    # -- contract -------------------------------------------------------------------------
    def submit(self, requests: list[Request]) -> list[int]:
        handles = []
        for req in requests:
            if not req.prompt_ids:
                raise ValueError("engine request has an empty prompt (prompt_ids must hold at least one token)")
            seed = req.params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seeder))
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self._queue.append((self._next_handle, req, gen))
            handles.append(self._next_handle)
            self._next_handle += 1
        return handles

    def step(self) -> list[Completion]:
        """Advance generation by one token (starting a batch first if none is running)."""
        start = time.perf_counter()
        finished: list[Completion] = []
        if self._batch is None and self._queue:
            self._start_batch()
        elif self._batch is not None:
            self._decode()
        if self._batch is not None and all(d is not None for d in self._batch.done):
            finished = self._retire()
        self.stats.wall_seconds += time.perf_counter() - start
        return finished

    def _busy(self) -> bool:
        return bool(self._queue) or self._batch is not None

    # -- internals ------------------------------------------------------------------------
    @torch.no_grad()
    def _start_batch(self) -> None:
        take, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size :]
        handles, requests, gens = zip(*take)
        width = max(len(r.prompt_ids) for r in requests)
        dev = self.device
        ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):  # left padding: every row's last token is at the end
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        from transformers import DynamicCache

        cache = DynamicCache()
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
            use_cache=True, logits_to_keep=1,
        )
        self.stats.prefill_tokens += int(mask.sum())
        self.stats.forward_calls += 1
        n = len(requests)
        self._batch = _Batch(
            handles=list(handles), requests=list(requests), generators=list(gens), cache=out.past_key_values,
            attention_mask=mask, next_positions=positions[:, -1] + 1,
            tokens=[[] for _ in range(n)], logprobs=[[] for _ in range(n)], versions=[[] for _ in range(n)],
            done=[None] * n,
        )
        self._sample(out.logits[:, -1, :])

    @torch.no_grad()
    def _decode(self) -> None:
        b = self._batch
        b.attention_mask = torch.cat([b.attention_mask, b.attention_mask.new_ones((len(b.handles), 1))], dim=1)
        out = self.model(
            input_ids=b.last_tokens[:, None], attention_mask=b.attention_mask, position_ids=b.next_positions[:, None],
            past_key_values=b.cache, use_cache=True,
        )
        b.cache = out.past_key_values
        b.next_positions = b.next_positions + 1
        self.stats.forward_calls += 1
        self._sample(out.logits[:, -1, :])

    def _sample(self, logits: torch.Tensor) -> None:
        b = self._batch
        token_ids, logprobs = sample_next(logits.float(), [r.params for r in b.requests], b.generators)
        token_list, logprob_list = token_ids.tolist(), logprobs.tolist()
        self.stats.padded_decode_slots += len(b.handles)
        for i, req in enumerate(b.requests):
            if b.done[i] is not None:
                continue
            tok = token_list[i]
            b.tokens[i].append(tok)
            b.logprobs[i].append(logprob_list[i])
            b.versions[i].append(self.version)
            self.stats.decode_tokens += 1
            if tok in req.params.stop_token_ids:
                b.done[i] = "stop"
            elif len(b.tokens[i]) >= req.params.max_new_tokens:
                b.done[i] = "length"
        finished = torch.tensor([d is not None for d in b.done], device=token_ids.device)
        b.last_tokens = torch.where(finished, torch.full_like(token_ids, self.pad_token_id), token_ids)

    def _retire(self) -> list[Completion]:
        b, self._batch = self._batch, None
        return [
            Completion(
                handle=h, prompt_ids=list(r.prompt_ids), token_ids=toks, logprobs=lps, versions=vers,
                finish_reason=done,
            )
            for h, r, toks, lps, vers, done in zip(b.handles, b.requests, b.tokens, b.logprobs, b.versions, b.done)
        ]
