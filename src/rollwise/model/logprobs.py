"""Per-token log-probabilities and entropies of given token ids under a causal LM."""

from __future__ import annotations

import torch


def token_logprobs_and_entropy(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token and the entropy of each next-token distribution.

    input_ids, attention_mask: [B, T], right-padded. Returns ``logprobs [B, T-1]`` where
    ``logprobs[:, t]`` is log p(input_ids[:, t+1] | input_ids[:, :t+1]), and ``entropy
    [B, T-1]`` (None when ``with_entropy`` is False). Logits are divided by ``temperature``
    so the values match what the engine sampled from (as TRL does).
    """
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
    logits = logits[:, :-1].float() / temperature  # [B, T-1, V]
    logp_all = logits.log_softmax(-1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T-1]
    return logprobs, entropy
