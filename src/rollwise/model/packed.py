"""The training forward of Llama-family models on packed sequences, with autograd.

The policy update used to run the HF module on a right-padded ``[B, T]`` batch: every row
padded to the longest one (30% of the demo's update was padding) and HF's per-call machinery
(mask building, cache objects, repeated dtype casts) on top. This forward instead:

- runs every per-token op (norms, projections, RoPE, MLP) on the flat stream of real tokens:
  no padding is computed at all — the "padding-free" path of TRL's ``padding_free`` / verl's
  ``use_remove_padding``;
- for attention only, **packs** the sequences into bins of ``capacity`` tokens (first-fit
  decreasing: a bin holds several short sequences end to end), each keeping its own positions
  (RoPE restarts at 0) and attending only to itself through a block-diagonal causal mask — a
  dense mask where GPU frameworks use varlen flash-attention (CPU has none);
- runs the arithmetic of the engine's own Llama implementation (``rollwise.engine.llama``,
  the same parameter references: no copies, gradients reach the HF module's parameters) with
  q/k/v fused into one matrix multiply, and RoPE on q and k as one complex
  multiply (no ``rotate_half`` copies forward or backward);
- applies LoRA adapters (``model.lora``) in their factored form, ``x Wᵀ + s·B(A(drop(x)))``
  as peft does, so gradients reach ``A`` and ``B`` and dropout acts while training (the slot
  engine samples from the merged weights instead);
- sends through the LM head only the positions that are scored (completion tokens), not the
  prompt's, in slices under a logits budget with activation checkpointing
  (``rollwise.model.logprobs``: the ``[N, V]`` float32 logits of a 150k vocabulary never exist
  at once).

The result is laid out as the padded path's: ``[B, T-1]`` log-probs (and entropies), zero
where nothing is scored, so everything downstream is unchanged. ``tests/test_packed.py``
checks log-probs, entropies and gradients equal the HF module's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rollwise.engine.llama import Adapter, LlamaForward, UnsupportedModelError, _rms, check_supported
from rollwise.model.logprobs import _scored


def supports_packing(model) -> bool:
    """True when ``model`` is a Llama-family HF module the packed forward runs."""
    try:
        check_supported(model)
    except UnsupportedModelError:
        return False
    return not getattr(model.config, "final_logit_softcapping", None)


def pack(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices per bin: first-fit decreasing, each bin's lengths summing to ≤ ``capacity``.

    >>> pack([5, 3, 2, 4], 6)
    [[0], [3, 2], [1]]
    """
    if lengths and max(lengths) > capacity:
        raise ValueError(f"a sequence of {max(lengths)} tokens does not fit a bin of {capacity}")
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        for b, free in enumerate(room):
            if lengths[row] <= free:
                bins[b].append(row)
                room[b] -= lengths[row]
                break
        else:
            bins.append([row])
            room.append(capacity - lengths[row])
    return bins


@dataclass
class Packing:
    """Where each real token of a right-padded ``[B, T]`` batch sits in ``[bins, capacity]``."""

    bins: int
    capacity: int
    starts: torch.Tensor  # [B] flat bin position of each row's first token
    dest: torch.Tensor  # [N] flat bin position of each real token, in row-major (row, t) order
    rows: torch.Tensor  # [N] its row
    cols: torch.Tensor  # [N] its column t
    positions: torch.Tensor  # [bins, capacity] position within its own sequence (0 at padding)
    segments: torch.Tensor  # [bins, capacity] which sequence (a unique negative id at padding)

    @classmethod
    def build(cls, attention_mask: torch.Tensor, capacity: int | None = None) -> "Packing":
        lengths = attention_mask.sum(-1)  # [B] (right-padded rows)
        capacity = max(int(lengths.max()), capacity or 0)
        bins = pack(lengths.tolist(), capacity)
        start = torch.zeros_like(lengths)  # [B] flat position of each row's first token
        for b, members in enumerate(bins):
            offset = b * capacity
            for row in members:
                start[row] = offset
                offset += int(lengths[row])
        rows, cols = attention_mask.nonzero(as_tuple=True)  # row-major: cols run 0..len-1 per row
        dest = start[rows] + cols
        total = len(bins) * capacity
        positions = torch.zeros(total, dtype=torch.long, device=dest.device)
        segments = -1 - torch.arange(total, device=dest.device)  # padding: each slot its own segment
        positions[dest] = cols
        segments[dest] = rows
        return cls(len(bins), capacity, start, dest, rows, cols, positions.view(len(bins), capacity),
                   segments.view(len(bins), capacity))

    def attention_bias(self, window: int | None, groups: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [bins, 1, groups·capacity, capacity]: a token sees the earlier tokens of
        its own sequence (within ``window``); query rows repeat per folded GQA head."""
        pos, seg = self.positions, self.segments
        visible = (seg[:, :, None] == seg[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
        if window is not None:
            visible &= pos[:, None, :] > pos[:, :, None] - window
        bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
        return bias.repeat(1, groups, 1)[:, None]


class PackedForward:
    """Hidden states of packed sequences through a Llama-family HF module, differentiable."""

    def __init__(self, model):
        self.llama = LlamaForward(model, merge_adapters=False)  # LoRA: factored, differentiable

    def hidden(self, input_ids: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Final-norm hidden states ``[N, D]`` of the ``N`` real tokens of ``input_ids [B, T]``,
        in row-major order (row 0's tokens, then row 1's, ...).

        Every per-token op — norms, projections, RoPE, the MLP — runs on the flat stream of real
        tokens, so no padding is computed at all; only attention, which must see each sequence
        whole, scatters q/k/v into the bins of ``packing`` and gathers its output back.
        """
        f = self.llama
        f.refresh()  # parameter references, in case a load replaced the tensors
        f.ensure_rope(packing.capacity)
        nb, C = packing.bins, packing.capacity
        H, Hkv, G, hd = f.n_heads, f.n_kv_heads, f.groups, f.head_dim
        n, half = len(packing.dest), hd // 2
        x = F.embedding(input_ids[packing.rows, packing.cols], f.embed)  # [N, D]
        cis = torch.complex(f._cos[:, :half], f._sin[:, half:])[packing.cols][:, None]  # [N, 1, hd/2]
        pairs = _rope_pairs(H + Hkv, hd, qkv_rows=(H + 2 * Hkv) * hd, device=x.device)
        masks = {w: packing.attention_bias(w, G, f.dtype) for w in f.windows}

        def to_bins(t: torch.Tensor, heads: int) -> torch.Tensor:  # [N, heads·hd] -> [nb, heads, C, hd]
            slots = t.new_zeros(nb * C, heads * hd).index_copy(0, packing.dest, t)
            return slots.view(nb, C, heads, hd).transpose(1, 2)

        for layer in f.layers:
            h = _rms(x, layer.norm_in, layer.eps)
            weight, bias = _fused(layer.q, layer.k, layer.v)
            qkv = F.linear(h, weight[pairs], None if bias is None else bias[pairs])  # [N, (H + 2 Hkv) hd]
            if any(name in layer.adapters for name in "qkv"):  # LoRA deltas, rows in the fused order
                deltas = [_delta(h, layer.adapters.get(name, ()), w.shape[0]) for name, (w, _) in
                          zip("qkv", (layer.q, layer.k, layer.v))]
                qkv = qkv + torch.cat(deltas, dim=-1)[:, pairs]
            # RoPE on q and k at once, as one complex multiply: their rows were reordered so that
            # features i and i + hd/2 of a head (the pair HF's rotate_half mixes) sit side by side
            qk = torch.view_as_complex(qkv[:, : (H + Hkv) * hd].reshape(n, H + Hkv, half, 2)) * cis
            qk = to_bins(torch.view_as_real(qk).view(n, (H + Hkv) * hd), H + Hkv)  # [nb, H + Hkv, C, hd]
            q, k = qk[:, :H], qk[:, H:]  # the same reordering in q and k: q·k is unchanged
            v = to_bins(qkv[:, (H + Hkv) * hd :], Hkv)  # [nb, Hkv, C, hd]
            o = F.scaled_dot_product_attention(q.reshape(nb, Hkv, G * C, hd), k, v, attn_mask=masks[layer.window],
                                               scale=layer.scale)  # [nb, Hkv, G*C, hd]
            o = o.view(nb, H, C, hd).transpose(1, 2).reshape(nb * C, H * hd).index_select(0, packing.dest)
            x = x + _linear(o, layer, "o")  # [N, D]
            h = _rms(x, layer.norm_post, layer.eps)
            # gate and up as two products: halves of one fused product are strided views, and the
            # elementwise ops on them (forward and backward) cost more than the second matmul saves
            x = x + _linear(layer.act(_linear(h, layer, "gate")) * _linear(h, layer, "up"), layer, "down")
        return _rms(x, *f.norm)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor, *,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, with_entropy: bool = True,
                 chunk: int | None = None, capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-prob of each scored next token, and its distribution's entropy, as ``[B, T-1]``.

        ``scored [B, T-1]`` (non-zero = compute) selects the columns, as in the padded path:
        column ``t`` scores ``input_ids[:, t+1]``; other columns are 0. ``chunk`` caps the
        positions per LM-head slice (``logits_chunk``); ``capacity`` the tokens per bin
        (default: the longest row). Sampling settings as ``token_logprobs_and_entropy``.
        """
        B, T = input_ids.shape
        packing = Packing.build(attention_mask, capacity)
        hidden = self.hidden(input_ids, packing)  # [N, D], row-major
        first = attention_mask.sum(-1).cumsum(0) - attention_mask.sum(-1)  # [B] each row's first token in it
        r, t = (scored != 0).nonzero(as_tuple=True)  # the positions to score, [S] each
        h = hidden[first[r] + t]  # [S, D]: the state after token t predicts token t+1
        targets = input_ids[r, t + 1][:, None]  # [S, 1]
        head = self.llama.lm_head
        sampling = (temperature, top_k, top_p, with_entropy)

        def piece(hs: torch.Tensor, tg: torch.Tensor):
            lp, ent = _scored(F.linear(hs, *head), tg, *sampling)
            return (lp, ent) if ent is not None else (lp,)

        step = chunk or max(len(r), 1)
        outs = [checkpoint(piece, h[i:i + step], targets[i:i + step], use_reentrant=False)
                if chunk and torch.is_grad_enabled() else piece(h[i:i + step], targets[i:i + step])
                for i in range(0, len(r), step)]
        lp = torch.cat([o[0] for o in outs]) if outs else h.new_zeros(0)
        logprobs = torch.zeros(B, T - 1, dtype=lp.dtype, device=lp.device).index_put((r, t), lp)
        if not with_entropy:
            return logprobs, None
        ent = torch.cat([o[1] for o in outs]) if outs else lp.new_zeros(0)
        return logprobs, torch.zeros_like(logprobs).index_put((r, t), ent)


def _linear(x: torch.Tensor, layer, name: str) -> torch.Tensor:
    """Linear ``name`` of ``layer`` (``o``, ``gate``, ``up``, ``down``) plus its LoRA adapters, if any."""
    y = F.linear(x, *getattr(layer, name))
    for adapter in layer.adapters.get(name, ()):
        y = y + adapter(x)
    return y


def _delta(x: torch.Tensor, adapters: tuple[Adapter, ...], out: int) -> torch.Tensor:
    """The summed LoRA output ``[N, out]`` of ``adapters`` on ``x`` (zeros when there is none)."""
    if not adapters:
        return x.new_zeros(x.shape[0], out)
    return sum(adapter(x) for adapter in adapters)


def _rope_pairs(heads: int, hd: int, qkv_rows: int, device) -> torch.Tensor:
    """Row order of a fused q/k/v weight that puts features ``i`` and ``i + hd/2`` of each of the
    first ``heads`` heads next to each other (the value rows keep their order).

    >>> _rope_pairs(1, 4, 6, "cpu").tolist()
    [0, 2, 1, 3, 4, 5]
    """
    half = hd // 2
    within = torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()  # [hd]
    qk = (torch.arange(heads)[:, None] * hd + within).flatten()
    return torch.cat((qk, torch.arange(heads * hd, qkv_rows))).to(device)


def _fused(*parts: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (weight, bias) for several linears on the same input: one matrix multiply instead of
    several (a small model's update is bound by how many ops it launches, not only FLOPs)."""
    weight = torch.cat([w for w, _ in parts])
    if all(b is None for _, b in parts):
        return weight, None
    return weight, torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts])
