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

**Shared prompts** (``share_prompts``, ``optim.share_prompts``). The rows of a GRPO group
repeat one prompt in front of different completions (a ~50-token chat prompt before ~15
completion tokens, eight times). Rows whose prompt ids are identical — the prompt of a row is
its tokens up to its first scored column — are laid out as one *unit*: the prompt once
(positions ``0..P-1``, causal among themselves), then each row's completion as a segment at
positions ``P..P+L-1`` that sees the whole prompt and its own earlier tokens, never another
completion. A completion's first token is scored from the prompt's last state (shared), the
rest from its segment, so the backward accumulates every row's gradient through the one
prompt exactly as through its own copy: the numbers are the unshared path's (prefix sharing
of SGLang's RadixAttention and of "prefix grouper"-style GRPO training, here within one
dense-masked bin). Only identical prompts are shared and completions are never merged (tree
rollouts, ``loss_weights`` are untouched). A unit longer than a bin splits into several, each
with its own prompt copy. The bin size is a trade (``choose_capacity``): larger bins share more
of a group's prompt, but the dense mask makes each bin's attention cost its size squared — so
long completions, where the prompt is a small share of a row, keep bins near the longest row
(on the ``small`` preset, 50-token prompts before ~300-token completions, bins 4× the longest
row computed 11% fewer tokens yet made the forward and backward 1.5–2.4× slower on a busy
machine; ~15-token completions: one bin per group, 0.3× the time). ``PackedForward.prompt_tokens_shared``
counts the prompt tokens not computed again. One difference under LoRA dropout while
training: a shared prompt draws one dropout mask for all its rows, not one per copy (the
same expected gradient, correlated across the group).

The result is laid out as the padded path's: ``[B, T-1]`` log-probs (and entropies), zero
where nothing is scored, so everything downstream is unchanged. ``tests/test_packed.py``
checks log-probs, entropies and gradients equal the HF module's own forward, and
``tests/test_packed_shared.py`` that sharing prompts changes none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rollwise.engine.llama import Adapter, LlamaForward, UnsupportedModelError, check_supported, rms_norm
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


SHARED = -1  # the segment id of a shared prompt's tokens: every segment of its unit sees them
SHARED_BIN_ROWS = 4  # choose_capacity tries bins of up to this many longest rows' worth of tokens


def shared_units(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 scored: torch.Tensor) -> list[tuple[int, list[int]]]:
    """Rows of ``input_ids [B, T]`` grouped by identical prompt, as (prompt length, member rows).

    A row's prompt is its tokens up to its first scored column (column ``t`` of ``scored
    [B, T-1]`` scores token ``t+1``); a row with nothing scored is its own unit, whole.

    >>> ids = torch.tensor([[1, 2, 5, 0], [1, 2, 6, 7], [1, 3, 5, 0]])
    >>> attn = (ids != 0).long()
    >>> shared_units(ids, attn, torch.tensor([[0, 1, 0], [0, 1, 1], [0, 1, 0]]))
    [(2, [0, 1]), (2, [2])]
    """
    lengths = attention_mask.sum(-1).tolist()
    hit = scored != 0
    first = hit.int().argmax(-1).tolist()  # [B] each row's first scored column
    units: dict[tuple[int, ...], list[int]] = {}
    whole: list[tuple[int, list[int]]] = []
    for r, (row, any_hit) in enumerate(zip(input_ids.tolist(), hit.any(-1).tolist())):
        if any_hit:
            units.setdefault(tuple(row[: first[r] + 1]), []).append(r)
        else:
            whole.append((lengths[r], [r]))
    return [(len(prompt), members) for prompt, members in units.items()] + whole


@dataclass
class Packing:
    """Where each token the forward computes sits in ``[bins, capacity]``, and which computed
    token holds each real token of the right-padded ``[B, T]`` batch.

    A unit is a prompt and the completions of its member rows; without shared prompts, every
    row is a unit of one sequence and each real token is computed once.
    """

    bins: int
    capacity: int
    rows: torch.Tensor  # [N] the row of each computed token (a shared prompt's: its unit's first member)
    cols: torch.Tensor  # [N] its column t, which is also its position
    dest: torch.Tensor  # [N] its flat bin position
    index: torch.Tensor  # [B, T] the computed token holding each real token (-1 at padding)
    positions: torch.Tensor  # [bins, capacity] position within its own sequence (0 at padding)
    units: torch.Tensor  # [bins, capacity] which unit (a unique negative id at padding)
    segments: torch.Tensor  # [bins, capacity] which row, SHARED on a shared prompt and at padding
    shared: int = 0  # prompt tokens not computed again: Σ (members - 1) × prompt length

    @classmethod
    def build(cls, attention_mask: torch.Tensor, capacity: int | None = None,
              units: list[tuple[int, list[int]]] | None = None, pair_cost: float = 0.0) -> "Packing":
        """``units`` as ``shared_units`` returns them (None: every row alone); ``capacity``
        defaults to the longest row, or with ``units`` to ``choose_capacity(..., pair_cost)``
        (``pair_cost`` 0: the bins that share the most)."""
        B, T = attention_mask.shape
        lengths = attention_mask.sum(-1).tolist()  # right-padded rows
        longest = max(lengths)
        if capacity is None and units is not None:
            capacity = choose_capacity(units, lengths, pair_cost)
        units = [(n, [r]) for r, n in enumerate(lengths)] if units is None else units
        capacity = max(capacity or 0, longest)
        units = [part for u in units for part in _split(u, lengths, capacity)]
        # pieces (row, first column, tokens, flat destination, unit, segment): a prompt, then its completions
        pieces: list[tuple[int, int, int, int, int, int]] = []
        layout = pack([_span(u, lengths) for u in units], capacity)
        for b, members in enumerate(layout):
            offset = b * capacity
            for u in members:
                prompt, rows = units[u]
                pieces.append((rows[0], 0, prompt, offset, u, SHARED if len(rows) > 1 else rows[0]))
                offset += prompt
                for r in rows:
                    pieces.append((r, prompt, lengths[r] - prompt, offset, u, r))
                    offset += lengths[r] - prompt
        device, bins = attention_mask.device, len(layout)
        piece = torch.tensor(pieces, dtype=torch.long, device=device).view(-1, 6)  # [K, 6]
        sizes = piece[:, 2]
        of = torch.repeat_interleave(torch.arange(len(piece), device=device), sizes)  # [N] each token's piece
        n = len(of)
        within = torch.arange(n, device=device) - (sizes.cumsum(0) - sizes)[of]
        rows, cols, dest = piece[of, 0], piece[of, 1] + within, piece[of, 3] + within
        total = bins * capacity
        positions = torch.zeros(total, dtype=torch.long, device=device)
        unit_ids = -1 - torch.arange(total, device=device)  # padding: each slot its own unit
        segments = torch.full((total,), SHARED, dtype=torch.long, device=device)
        positions[dest], unit_ids[dest], segments[dest] = cols, piece[of, 4], piece[of, 5]
        index = torch.full((B, T), -1, dtype=torch.long, device=device)
        index[rows, cols] = torch.arange(n, device=device)
        for prompt, members in units:  # every member reads the one prompt
            if len(members) > 1:
                index[members[1:], :prompt] = index[members[0], :prompt].clone()
        shared = sum((len(m) - 1) * prompt for prompt, m in units)
        return cls(bins, capacity, rows, cols, dest, index, positions.view(bins, capacity),
                   unit_ids.view(bins, capacity), segments.view(bins, capacity), shared)

    def attention_bias(self, window: int | None, groups: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [bins, 1, groups·capacity, capacity]: a token sees the earlier tokens of
        its own sequence and its unit's shared prompt (within ``window``); query rows repeat per
        folded GQA head."""
        pos, unit, seg = self.positions, self.units, self.segments
        visible = ((unit[:, :, None] == unit[:, None, :]) & (pos[:, None, :] <= pos[:, :, None])
                   & ((seg[:, :, None] == seg[:, None, :]) | (seg[:, None, :] == SHARED)))
        if window is not None:
            visible &= pos[:, None, :] > pos[:, :, None] - window
        bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))
        return bias.repeat(1, groups, 1)[:, None]


def choose_capacity(units: list[tuple[int, list[int]]], lengths: list[int], pair_cost: float) -> int:
    """The bin size, among 1, 2 and ``SHARED_BIN_ROWS`` × the longest row and the longest unit
    between them, with the least estimated work: tokens computed (after splitting units that do
    not fit) + ``pair_cost`` × bins × size² (the dense attention of each bin, per query-key pair,
    in units of one token's per-token work). Ties go to the smaller bin.

    >>> units = [(50, list(range(8)))]  # 8 rows share a 50-token prompt
    >>> choose_capacity(units, [65] * 8, pair_cost=1e-3), choose_capacity(units, [550] * 8, pair_cost=1e-3)
    (170, 550)
    """
    longest = max(lengths)
    widest = max(_span(u, lengths) for u in units)
    candidates = sorted({longest * k for k in (1, 2, SHARED_BIN_ROWS)} | {min(widest, SHARED_BIN_ROWS * longest)})

    def cost(capacity: int) -> float:
        spans = [_span(part, lengths) for u in units for part in _split(u, lengths, capacity)]
        return sum(spans) + pair_cost * len(pack(spans, capacity)) * capacity**2

    return min(candidates, key=cost)


def _span(unit: tuple[int, list[int]], lengths: list[int]) -> int:
    """Tokens of a unit laid out: its prompt once, then every member's completion."""
    prompt, rows = unit
    return prompt + sum(lengths[r] - prompt for r in rows)


def _split(unit: tuple[int, list[int]], lengths: list[int], capacity: int) -> list[tuple[int, list[int]]]:
    """A unit as units that each fit a bin: its completions first-fit decreasing into
    ``capacity - prompt`` tokens, each part with its own copy of the prompt."""
    prompt, rows = unit
    if _span(unit, lengths) <= capacity:
        return [unit]
    parts = pack([lengths[r] - prompt for r in rows], capacity - prompt)
    return [(prompt, [rows[i] for i in part]) for part in parts]


def _rotate(pairs: torch.Tensor, cis: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on feature pairs ``[N, heads, hd/2, 2]`` (a, b) -> (a·cos − b·sin, a·sin + b·cos)."""
    if cis is not None:
        return torch.view_as_real(torch.view_as_complex(pairs) * cis)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1)


class PackedForward:
    """Hidden states of packed sequences through a Llama-family HF module, differentiable."""

    def __init__(self, model):
        self.llama = LlamaForward(model, merge_adapters=False)  # LoRA: factored, differentiable
        self.prompt_tokens_shared = 0  # prompt tokens shared prompts spared, over every call so far
        # one query-key pair of dense attention (q·k and its share of the weighted sum: 4·hd FLOPs
        # per head) against one token's linears (2 FLOPs per weight), for choose_capacity
        layer, f = self.llama.layers[0], self.llama
        weights = sum(getattr(layer, name)[0].numel() for name in ("q", "k", "v", "o", "gate", "up", "down"))
        self.pair_cost = 2 * f.n_heads * f.head_dim / weights

    def hidden(self, input_ids: torch.Tensor, packing: Packing) -> torch.Tensor:
        """Final-norm hidden states ``[N, D]`` of the ``N`` tokens ``packing`` computes (each real
        token of ``input_ids [B, T]`` once, a shared prompt once for all its rows), in its order:
        ``packing.index`` says which one holds a given ``(row, t)``.

        Every per-token op — norms, projections, RoPE, the MLP — runs on the flat stream of real
        tokens, so no padding is computed at all; only attention, which must see each sequence
        whole, scatters q/k/v into the bins of ``packing`` and gathers its output back.
        """
        f = self.llama
        f.refresh()  # parameter references, in case a load replaced the tensors
        f.ensure_rope(int(packing.cols.max()) + 1 if len(packing.cols) else 1)  # the positions used, not the bin
        nb, C = packing.bins, packing.capacity
        H, Hkv, G, hd = f.n_heads, f.n_kv_heads, f.groups, f.head_dim
        n, half = len(packing.dest), hd // 2
        x = F.embedding(input_ids[packing.rows, packing.cols], f.embed)  # [N, D]
        cos, sin = f._cos[packing.cols, :half][:, None], f._sin[packing.cols, half:][:, None]  # [N, 1, hd/2]
        # float32/64: one complex multiply; torch has no bfloat16 complex, so below float32 the same
        # rotation in real arithmetic, rounded op by op as HF's q*cos + rotate_half(q)*sin
        cis = torch.complex(cos, sin) if f.dtype in (torch.float32, torch.float64) else None
        pairs = _rope_pairs(H + Hkv, hd, qkv_rows=(H + 2 * Hkv) * hd, device=x.device)
        masks = {w: packing.attention_bias(w, G, f.dtype) for w in f.windows}

        def to_bins(t: torch.Tensor, heads: int) -> torch.Tensor:  # [N, heads·hd] -> [nb, heads, C, hd]
            slots = t.new_zeros(nb * C, heads * hd).index_copy(0, packing.dest, t)
            return slots.view(nb, C, heads, hd).transpose(1, 2)

        for layer in f.layers:
            h = rms_norm(x, layer.norm_in, layer.eps)
            weight, bias = _fused(layer.q, layer.k, layer.v)
            qkv = F.linear(h, weight[pairs], None if bias is None else bias[pairs])  # [N, (H + 2 Hkv) hd]
            if any(name in layer.adapters for name in "qkv"):  # LoRA deltas, rows in the fused order
                deltas = [_delta(h, layer.adapters.get(name, ()), w.shape[0]) for name, (w, _) in
                          zip("qkv", (layer.q, layer.k, layer.v))]
                qkv = qkv + torch.cat(deltas, dim=-1)[:, pairs]
            # RoPE on q and k at once, as one complex multiply: their rows were reordered so that
            # features i and i + hd/2 of a head (the pair HF's rotate_half mixes) sit side by side
            qk = _rotate(qkv[:, : (H + Hkv) * hd].reshape(n, H + Hkv, half, 2), cis, cos, sin)
            qk = to_bins(qk.view(n, (H + Hkv) * hd), H + Hkv)  # [nb, H + Hkv, C, hd]
            q, k = qk[:, :H], qk[:, H:]  # the same reordering in q and k: q·k is unchanged
            v = to_bins(qkv[:, (H + Hkv) * hd :], Hkv)  # [nb, Hkv, C, hd]
            o = F.scaled_dot_product_attention(q.reshape(nb, Hkv, G * C, hd), k, v, attn_mask=masks[layer.window],
                                               scale=layer.scale)  # [nb, Hkv, G*C, hd]
            o = o.view(nb, H, C, hd).transpose(1, 2).reshape(nb * C, H * hd).index_select(0, packing.dest)
            x = x + _linear(o, layer, "o")  # [N, D]
            h = rms_norm(x, layer.norm_post, layer.eps)
            # gate and up as two products: halves of one fused product are strided views, and the
            # elementwise ops on them (forward and backward) cost more than the second matmul saves
            x = x + _linear(layer.act(_linear(h, layer, "gate")) * _linear(h, layer, "up"), layer, "down")
        return rms_norm(x, *f.norm)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor, *,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, with_entropy: bool = True,
                 chunk: int | None = None, capacity: int | None = None,
                 share_prompts: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-prob of each scored next token, and its distribution's entropy, as ``[B, T-1]``.

        ``scored [B, T-1]`` (non-zero = compute) selects the columns, as in the padded path:
        column ``t`` scores ``input_ids[:, t+1]``; other columns are 0. ``chunk`` caps the
        positions per LM-head slice (``logits_chunk``); ``capacity`` the tokens per bin
        (default: the longest unit, see ``Packing.build``). ``share_prompts`` computes the
        prompt of rows with identical prompts once (the module docstring); the numbers are
        the same either way. Sampling settings as ``token_logprobs_and_entropy``.
        """
        B, T = input_ids.shape
        units = shared_units(input_ids, attention_mask, scored) if share_prompts else None
        packing = Packing.build(attention_mask, capacity, units, self.pair_cost)
        self.prompt_tokens_shared += packing.shared
        hidden = self.hidden(input_ids, packing)  # [N, D]
        r, t = (scored != 0).nonzero(as_tuple=True)  # the positions to score, [S] each
        h = hidden[packing.index[r, t]]  # [S, D]: the state after token t predicts token t+1
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
