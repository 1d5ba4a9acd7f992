"""A compact Llama-family forward pass over a slot KV cache the engine owns.

Engine v2 (``slots.SlotEngine``) does not call the HF module's ``forward``: HF's cache and
mask machinery re-pads and re-allocates on every call, which is most of the time of a small
model's decode step. Instead this file runs the same arithmetic with the HF module's own
parameters (read by reference, so in-place updates from a trainer are seen; no copies):
embed → per layer [RMSNorm → q/k/v (biases if present, as in Qwen2) → RoPE → attention →
o_proj → residual → RMSNorm → gate/up/down MLP with the config's activation → residual] →
norm → lm_head. Rotary cos/sin come from the model's own ``rotary_emb``; attention is
``scaled_dot_product_attention`` with a per-slot length mask (and a sliding window where the
config has one). Grouped-query attention needs no ``repeat_kv``: the query heads of a group
are folded into the query-length dimension, so each key/value head is read once.

LoRA (peft's ``lora.Linear``, ``model.lora``): a wrapped linear holds the frozen ``base_layer``
and adapters ``A``, ``B`` with a ``scaling``. For sampling, ``refresh`` folds them into one
matrix ``W + scaling·B·A`` (without gradient, no dropout; summed in float32, rounded once;
a new tensor, the base is never written), so a decode step costs what it
costs without LoRA; the price is one merged copy of each wrapped weight, rebuilt at every
``refresh`` (every ``load_weights``): in-place updates to an adapter are seen only then. The
packed training forward asks for the factored form instead (``merge_adapters=False``): base
weight plus ``Adapter`` references, so gradients reach ``A`` and ``B``.

Precision (``dtype``): by default the forward computes in the model's own dtype on its own
tensors. Given another ``dtype`` (the engine's sampling precision, ``rollout.engine_dtype``),
``refresh`` casts every tensor it reads into a copy the forward owns (a tied embedding/LM head
cast once), the cache is kept in that dtype, and the trainer's fp32 master weights are never
written; a copy follows the model only at ``refresh`` (every ``load_weights``).

Supported: ``model_type`` in ``SUPPORTED_MODEL_TYPES``. Anything else raises
``UnsupportedModelError`` at construction; callers fall back to the v1 ``Engine``, which runs
any HF causal LM through its own forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class UnsupportedModelError(ValueError):
    """The model is not one the slot engine can run (use ``rollwise.engine.engine.Engine``)."""


def check_supported(model) -> None:
    """Raise ``UnsupportedModelError`` unless ``model`` is a Llama-family causal LM we can run."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"the slot engine runs model_type in {SUPPORTED_MODEL_TYPES}, not {model_type!r}; "
            "use rollwise.engine.engine.Engine (v1), which runs any Hugging Face causal LM"
        )
    rope_type = getattr(getattr(model.model, "rotary_emb", None), "rope_type", None)
    if rope_type is None or "dynamic" in rope_type:
        # dynamic RoPE rescales with the longest sequence seen, so one cos/sin table is wrong
        raise UnsupportedModelError(
            f"the slot engine needs a static RoPE (got rope_type {rope_type!r}); use the v1 Engine"
        )


@dataclass
class _Layer:
    """References to one decoder layer's parameters (never copies)."""

    norm_in: torch.Tensor
    norm_post: torch.Tensor
    eps: float
    q: tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias)
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    act: torch.nn.Module
    scale: float
    window: int | None  # sliding-window length, None = full attention
    adapters: dict[str, tuple["Adapter", ...]] = field(default_factory=dict)  # unmerged LoRA, by linear (q, k, ...)


@dataclass
class Adapter:
    """One LoRA adapter on a linear, by reference: it adds ``scaling · B(A(dropout(x)))``."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scaling: float
    dropout: torch.nn.Module  # identity when lora dropout is 0; inactive in eval mode

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # as peft: in the adapter's dtype (peft keeps it float32 under a bf16/fp16 base), then back
        y = F.linear(F.linear(self.dropout(x.to(self.a.dtype)), self.a), self.b) * self.scaling
        return y.to(x.dtype)


def _active(linear) -> list[str]:
    """The adapters a peft LoRA linear applies now ([] for a plain linear, disabled or merged adapters)."""
    if getattr(linear, "base_layer", None) is None or linear.disable_adapters or linear.merged:
        return []
    return [name for name in linear.active_adapters if name in linear.lora_A]


def _wb(linear: torch.nn.Linear, merge: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) by reference; for a LoRA linear with ``merge``, a new merged weight
    ``W + Σ scaling·B·A`` (no gradient), else its base weight (the adapters go in ``_adapters``)."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight, linear.bias
    names = _active(linear) if merge else []
    if not names:
        return base.weight, base.bias
    with torch.no_grad():  # in float32, rounded once to the base dtype
        weight = base.weight.to(torch.float32, copy=True)  # a copy even when already float32
        for n in names:
            weight += linear.scaling[n] * (linear.lora_B[n].weight.float() @ linear.lora_A[n].weight.float())
    return weight.to(base.weight.dtype), base.bias


def _adapters(linear) -> tuple[Adapter, ...]:
    """The active LoRA adapters of ``linear`` as ``Adapter`` references (() for a plain linear)."""
    return tuple(Adapter(linear.lora_A[n].weight, linear.lora_B[n].weight, linear.scaling[n], linear.lora_dropout[n])
                 for n in _active(linear))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the Llama family computes it (also the packed training forward's, model/packed.py)."""
    if x.dtype == torch.float32:  # one call, same arithmetic
        return F.rms_norm(x, weight.shape, weight, eps)
    # as HF's LlamaRMSNorm: normalise in fp32, cast back, then scale
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # HF's x*cos + rotate_half(x)*sin, where rotate_half(x) = cat(-x2, x1) = roll(x, half) * [-1.., 1..];
    # the sign lives in ``signed_sin`` (negation is exact, so this is bit-identical)
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


class SlotKV:
    """Keys and values per layer, each ``[num_slots, n_kv_heads, capacity, head_dim]``.

    Row ``r`` of every tensor belongs to one running sequence; its first ``len`` positions
    hold that sequence's keys/values (the engine tracks ``len``). Positions past a row's
    length hold stale values that the length mask hides and later writes overwrite.
    """

    def __init__(self, num_layers: int, num_slots: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_slots, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` positions, keeping what is stored."""
        old = self.capacity
        for store in (self.k, self.v):
            for i, t in enumerate(store):
                bigger = t.new_zeros((t.shape[0], t.shape[1], capacity, t.shape[3]))
                bigger[:, :, :old] = t
                store[i] = bigger

    def copy_rows(self, src: list[int], dst: list[int], length: int) -> None:
        """Copy positions ``[0, length)`` of rows ``src`` into rows ``dst`` (one op per tensor)."""
        if not dst or length == 0:
            return
        device = self.k[0].device
        src_t = torch.tensor(src, device=device)
        dst_t = torch.tensor(dst, device=device)
        for t in (*self.k, *self.v):
            t[dst_t, :, :length] = t[src_t, :, :length]


    def export_row(self, row: int, length: int) -> list[torch.Tensor]:
        """Copies of positions ``[0, length)`` of ``row``: one ``[2, n_kv_heads, length, head_dim]`` per layer."""
        return [torch.stack((k[row, :, :length], v[row, :, :length])) for k, v in zip(self.k, self.v)]

    def import_row(self, row: int, cached: list[torch.Tensor]) -> None:
        """Write ``export_row``'s copies into ``row``."""
        length = cached[0].shape[2]
        for k, v, kv in zip(self.k, self.v, cached):
            k[row, :, :length] = kv[0]
            v[row, :, :length] = kv[1]


class LlamaForward:
    """Prefill and decode for a Llama / Qwen2 / Mistral HF module over a ``SlotKV``."""

    def __init__(self, model, merge_adapters: bool = True, dtype: torch.dtype | None = None):
        self.capture_hidden, self.hidden = False, None  # set by the engine when a row keeps its hidden state
        check_supported(model)
        self.model = model
        self.merge_adapters = merge_adapters  # LoRA: one merged matrix per linear (sampling), else factored
        self.compute_dtype = dtype  # None: the model's own tensors, by reference; else an owned cast copy
        config = model.config
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.groups = self.n_heads // self.n_kv_heads
        self.num_layers = len(model.model.layers)
        self.refresh()
        self._cos = self._sin = None  # [capacity, head_dim] from the model's rotary_emb (sin signed for _rope)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def set_dtype(self, dtype: torch.dtype | None) -> None:
        """Compute in ``dtype`` from now on (None: the model's own): the copy is cast anew."""
        self.compute_dtype = dtype
        self._cos = self._sin = None  # the rotary tables follow the compute dtype
        self.refresh()

    def _caster(self):
        """``cast(tensor)``: the tensor itself, or its copy in ``compute_dtype`` (each tensor cast once)."""
        dtype, done = self.compute_dtype, {}

        def cast(t):
            if t is None or dtype is None or t.dtype == dtype:
                return t
            if id(t) not in done:
                with torch.no_grad():
                    done[id(t)] = t.detach().to(dtype)
            return done[id(t)]

        return cast

    def refresh(self) -> None:
        """Re-read parameter references (after a load that may have replaced tensors) — or, with a
        ``compute_dtype``, cast them anew; LoRA linears are merged anew (``merge_adapters``) or their
        adapters re-read."""
        m, merge, cast = self.model, self.merge_adapters, self._caster()
        wb = lambda linear: tuple(map(cast, _wb(linear, merge)))  # noqa: E731
        self.embed = cast(m.model.embed_tokens.weight)
        self.norm = (cast(m.model.norm.weight), m.model.norm.variance_epsilon)
        self.lm_head = wb(m.lm_head)
        config_window = getattr(m.config, "sliding_window", None)
        self.layers = []
        for layer in m.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            linears = {"q": a.q_proj, "k": a.k_proj, "v": a.v_proj, "o": a.o_proj,
                       "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
            self.layers.append(_Layer(
                norm_in=cast(layer.input_layernorm.weight), norm_post=cast(layer.post_attention_layernorm.weight),
                eps=layer.input_layernorm.variance_epsilon,
                **{name: wb(linear) for name, linear in linears.items()}, act=mlp.act_fn,
                scale=a.scaling,
                # Qwen2 sets it per layer (None on full-attention layers); Mistral in the config
                window=a.sliding_window if hasattr(a, "sliding_window") else config_window,
                adapters={} if merge else {n: ad for n, lin in linears.items() if (ad := _adapters(lin))},
            ))
        self.windows = sorted({layer.window for layer in self.layers}, key=lambda w: -1 if w is None else w)

    def new_cache(self, num_slots: int, capacity: int) -> SlotKV:
        self.ensure_rope(capacity)
        return SlotKV(self.num_layers, num_slots, self.n_kv_heads, self.head_dim, capacity, self.dtype, self.device)

    def ensure_rope(self, capacity: int) -> None:
        if self._cos is None or self._cos.shape[0] < capacity:
            positions = torch.arange(capacity, device=self.device)[None]
            cos, sin = self.model.model.rotary_emb(self.embed, positions)  # [1, capacity, head_dim]
            half = self.head_dim // 2
            self._cos, self._sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)

    def _bias(self, visible: torch.Tensor) -> torch.Tensor:
        # an additive mask: on CPU, SDPA runs faster with it than with a boolean one
        return torch.zeros(visible.shape, dtype=self.dtype, device=visible.device).masked_fill_(~visible, float("-inf"))

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, layer.norm_post, layer.eps)
        return F.linear(layer.act(F.linear(h, *layer.gate)) * F.linear(h, *layer.up), *layer.down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = rms_norm(x, *self.norm)
        if self.capture_hidden:  # what a quality probe reads: the normed state the LM head sees [rows, D]
            self.hidden = h
        return F.linear(h, *self.lm_head)

    def decode(self, kv: SlotKV, tokens: torch.Tensor, pos: torch.Tensor, buckets: list[tuple[int, int, int]]
               ) -> torch.Tensor:
        """One token for each of rows ``0..n-1``: ``tokens [n]`` at positions ``pos [n]``.

        Writes each row's key/value at its position. ``buckets`` cut the rows into contiguous
        ranges ``(start, end, span)``: rows of a range attend over ``[0, span)`` with keys past
        their own position masked (``span`` > their largest position), so short rows do not
        pay for the longest row's keys. Returns logits [n, V].
        """
        n = tokens.shape[0]
        H, Hkv, G, hd = self.n_heads, self.n_kv_heads, self.groups, self.head_dim
        x = F.embedding(tokens, self.embed)  # [n, D]
        cos, sin = self._cos[pos][:, None], self._sin[pos][:, None]  # [n, 1, hd]
        masks = {}
        for a, b, span in buckets:
            keys = torch.arange(span, device=tokens.device)
            for w in self.windows:
                visible = keys[None, :] <= pos[a:b, None]  # [rows, span]
                if w is not None:
                    visible &= keys[None, :] > pos[a:b, None] - w
                masks[a, w] = self._bias(visible[:, None, None, :])  # [rows, 1, 1, span]
        rows = torch.arange(n, device=tokens.device)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.norm_in, layer.eps)
            q = _rope(F.linear(h, *layer.q).view(n, H, hd), cos, sin)
            k = _rope(F.linear(h, *layer.k).view(n, Hkv, hd), cos, sin)
            v = F.linear(h, *layer.v).view(n, Hkv, hd)
            K, V = kv.k[i], kv.v[i]
            K[rows, :, pos] = k
            V[rows, :, pos] = v
            # the G query heads sharing a key/value head become G query rows of that head
            q = q.view(n, Hkv, G, hd)
            o = torch.cat([F.scaled_dot_product_attention(
                q[a:b], K[a:b, :, :span], V[a:b, :, :span], attn_mask=masks[a, layer.window], scale=layer.scale,
            ) for a, b, span in buckets]) if len(buckets) > 1 else F.scaled_dot_product_attention(
                q, K[:n, :, : buckets[0][2]], V[:n, :, : buckets[0][2]], attn_mask=masks[0, layer.window],
                scale=layer.scale,
            )  # [n, Hkv, G, hd]
            x = x + F.linear(o.reshape(n, H * hd), *layer.o)
            x = x + self._mlp(layer, x)
        return self._logits(x)

    def prefill(self, kv: SlotKV, ids: torch.Tensor, lengths: list[int], row0: int, start: int = 0) -> torch.Tensor:
        """Prompts ``ids [m, T]`` (right-padded; real lengths ``lengths``) into rows
        ``row0..row0+m-1`` at positions ``start..start+T-1``. With ``start > 0`` the rows already
        hold positions ``[0, start)`` (a shared prefix copied in) and the new tokens attend over
        them too. Returns the logits after each prompt's last token [m, V]."""
        m, T = ids.shape
        H, Hkv, G, hd = self.n_heads, self.n_kv_heads, self.groups, self.head_dim
        dev = ids.device
        x = F.embedding(ids, self.embed)  # [m, T, D]
        cos, sin = self._cos[start : start + T], self._sin[start : start + T]  # [T, hd], broadcast over heads
        t = torch.arange(T, device=dev)
        keys = torch.arange(start + T, device=dev)
        masks = {}
        for w in self.windows:
            # causal [T(query), start+T(key)]: query t sits at start+t; padding is after every real token
            visible = keys[None, :] <= t[:, None] + start
            if w is not None:
                visible &= keys[None, :] > t[:, None] + start - w
            masks[w] = self._bias(visible.repeat(G, 1))  # query row g*T + t of a folded head sees what t sees
        rows = slice(row0, row0 + m)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.norm_in, layer.eps)
            q = _rope(F.linear(h, *layer.q).view(m, T, H, hd).transpose(1, 2), cos, sin)  # [m, H, T, hd]
            k = _rope(F.linear(h, *layer.k).view(m, T, Hkv, hd).transpose(1, 2), cos, sin)  # [m, Hkv, T, hd]
            v = F.linear(h, *layer.v).view(m, T, Hkv, hd).transpose(1, 2)
            kv.k[i][rows, :, start : start + T] = k
            kv.v[i][rows, :, start : start + T] = v
            if start:  # the cached prefix and the new positions, as one key range
                k, v = kv.k[i][rows, :, : start + T], kv.v[i][rows, :, : start + T]
            o = F.scaled_dot_product_attention(
                q.reshape(m, Hkv, G * T, hd), k, v, attn_mask=masks[layer.window], scale=layer.scale
            )  # [m, Hkv, G*T, hd]
            o = o.view(m, H, T, hd).transpose(1, 2).reshape(m, T, H * hd)
            x = x + F.linear(o, *layer.o)
            x = x + self._mlp(layer, x)
        last = torch.tensor([n - 1 for n in lengths], device=dev)
        return self._logits(x[torch.arange(m, device=dev), last])  # [m, V]
