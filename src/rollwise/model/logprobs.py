"""Per-token log-probabilities and entropies of given token ids under a causal LM.

Two paths give the same numbers:

- whole: the model's logits ``[B, T, V]`` at once (small vocabularies: one matmul, no overhead);
- chunked (``chunk`` columns at a time): the decoder's hidden states ``[B, T, H]`` go through the
  LM head ``chunk`` positions at a time, and each chunk's log-softmax, gathered log-prob and
  entropy are recomputed in the backward pass (activation checkpointing) instead of kept. The
  ``[B, T, V]`` float32 logits of a 150k-token vocabulary — the memory peak of the update for
  a real model — then never exist at once: the peak is one ``[B, chunk, V]`` slice. The idea is
  the "chunked cross-entropy" of Liger-Kernel and Apple's Cut Cross-Entropy (Wijmans et al.,
  2024), without their fused kernels.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _scored(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int, top_p: float,
            with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-prob of ``targets`` [..., 1] → [...], entropy [...] or None) of logits [..., V]."""
    logits = logits.float() / temperature
    if top_k > 0 or top_p < 1.0:
        from rollwise.engine.sampling import filter_mask

        rows = logits.shape[:-1]
        drop = filter_mask(logits, torch.full(rows, top_k, device=logits.device),
                           torch.full(rows, top_p, device=logits.device))
        drop.scatter_(-1, targets, False)
        logits = logits.masked_fill(drop, float("-inf"))
    logp_all = logits.log_softmax(-1)
    logprobs = logp_all.gather(-1, targets).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            plogp = logp_all.exp() * logp_all
            entropy = -torch.where(torch.isfinite(logp_all), plogp, torch.zeros_like(plogp)).sum(-1)
    return logprobs, entropy


def logits_chunk(model, rows: int, width: int, budget_mb: float | None) -> int | None:
    """Positions per LM-head slice so that a slice's float32 logits and their log-softmax stay
    within ``budget_mb``; None (whole logits) when everything fits or no budget is set."""
    if budget_mb is None:
        return None
    vocab = model.get_output_embeddings().out_features
    per_position = rows * vocab * 4 * 3  # logits, log-softmax and exp/entropy temporaries, float32
    chunk = max(1, int(budget_mb * 2**20 // per_position))
    return None if chunk >= width - 1 else chunk


def token_logprobs_and_entropy(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True,
    top_k: int = 0, top_p: float = 1.0, chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token and the entropy of each next-token distribution.

    input_ids, attention_mask: [B, T], right-padded. Returns ``logprobs [B, T-1]`` where
    ``logprobs[:, t]`` is log p(input_ids[:, t+1] | input_ids[:, :t+1]), and ``entropy
    [B, T-1]`` (None when ``with_entropy`` is False). ``chunk`` (positions per LM-head slice)
    selects the chunked path; None computes the whole logits at once.

    The distribution is the one the engine samples from: logits divided by ``temperature``
    (as TRL does) and, when ``top_k``/``top_p`` are set, restricted to the same top-k/nucleus
    set (``rollwise.engine.sampling.filter_mask``) and renormalised, so behaviour and trainer
    log-probs (``logprob_gap``, ``tis_mis`` weights) compare one distribution, not the filter.
    The scored token always stays in the support: after an update it may fall outside the
    policy's own nucleus, and its log-prob must stay finite.
    """
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    targets = input_ids[:, 1:, None]  # [B, T-1, 1]
    if chunk is not None and getattr(model.config, "final_logit_softcapping", None):
        chunk = None  # the head is not the whole story for these models (Gemma 2): take the model's own logits
    if chunk is None or chunk >= input_ids.shape[1] - 1:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        return _scored(logits[:, :-1], targets, temperature, top_k, top_p, with_entropy)
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=positions).last_hidden_state[:, :-1]  # [B, T-1, H]
    head = model.get_output_embeddings()

    def piece(h: torch.Tensor, tgt: torch.Tensor):
        lp, ent = _scored(head(h), tgt, temperature, top_k, top_p, with_entropy)
        return (lp, ent) if ent is not None else (lp,)

    logprobs, entropies = [], []
    for start in range(0, hidden.shape[1], chunk):
        h, tgt = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        out = checkpoint(piece, h, tgt, use_reentrant=False) if torch.is_grad_enabled() else piece(h, tgt)
        logprobs.append(out[0])
        if with_entropy:
            entropies.append(out[1])
    return torch.cat(logprobs, 1), (torch.cat(entropies, 1) if with_entropy else None)
