"""Per-token log-probabilities and entropies of given token ids under a causal LM."""

from __future__ import annotations

import torch


def token_logprobs_and_entropy(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True,
    top_k: int = 0, top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token and the entropy of each next-token distribution.

    input_ids, attention_mask: [B, T], right-padded. Returns ``logprobs [B, T-1]`` where
    ``logprobs[:, t]`` is log p(input_ids[:, t+1] | input_ids[:, :t+1]), and ``entropy
    [B, T-1]`` (None when ``with_entropy`` is False).

    The distribution is the one the engine samples from: logits divided by ``temperature``
    (as TRL does) and, when ``top_k``/``top_p`` are set, restricted to the same top-k/nucleus
    set (``rollwise.engine.sampling.filter_mask``) and renormalised, so behaviour and trainer
    log-probs (``logprob_gap``, ``tis_mis`` weights) compare one distribution, not the filter.
    The scored token always stays in the support: after an update it may fall outside the
    policy's own nucleus, and its log-prob must stay finite.
    """
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
    logits = logits[:, :-1].float() / temperature  # [B, T-1, V]
    targets = input_ids[:, 1:, None]  # [B, T-1, 1]
    if top_k > 0 or top_p < 1.0:
        from rollwise.engine.sampling import filter_mask

        rows = logits.shape[:-1]
        drop = filter_mask(logits, torch.full(rows, top_k, device=logits.device),
                           torch.full(rows, top_p, device=logits.device))
        drop.scatter_(-1, targets, False)
        logits = logits.masked_fill(drop, float("-inf"))
    logp_all = logits.log_softmax(-1)
    logprobs = logp_all.gather(-1, targets).squeeze(-1)  # [B, T-1]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            plogp = logp_all.exp() * logp_all
            entropy = -torch.where(torch.isfinite(logp_all), plogp, torch.zeros_like(plogp)).sum(-1)  # [B, T-1]
    return logprobs, entropy
