"""``tis_mis``: truncated / masked importance sampling for the behaviour-vs-trainer mismatch.

The engine samples with log-probs ℓ^μ (its kernels, its precision, or — for partial
rollouts carried across steps (APRIL) — an older policy version); the trainer's proximal
policy gives ℓ^old. The detached weight ``w = exp(ℓ^old − ℓ^μ)`` corrects the policy-gradient
term in one of four modes ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", Yao et al., 2025, truncated IS; masked IS as in TRL's
``vllm_importance_sampling_mode``):

- ``token_truncate``: min(w, C)
- ``token_mask``: w · 1[w ≤ C]
- ``sequence_truncate``: min(Π w, C), one weight per sequence
- ``sequence_mask``: 1 if C_min ≤ Π w ≤ C else 0 (the sequence is dropped from the loss)
- ``none``: 1

Defaults follow TRL: ``sequence_mask`` with C = 3; token modes default to C = 2. Only the
first three are importance *weights* (``IS_WEIGHT_MODES``): ``sequence_mask`` is a 0/1 filter
that leaves every kept sequence at weight 1, so it corrects kernel noise but not staleness.
A run that trains on tokens sampled by older policies (async, replay, APRIL) therefore
defaults to ``token_truncate`` with C = 2 — AReaL's decoupled PPO weight sg(min(π_prox/μ, 2))
(``rollwise.train.config``).
Departure: ``sequence_mask`` keeps weight 1 inside the band (TRL's mask mode) rather than Πw,
so an on-policy sequence is weighted exactly as without correction.
"""

from __future__ import annotations

from typing import Literal

import torch

TISMode = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
IS_WEIGHT_MODES = ("token_truncate", "token_mask", "sequence_truncate")  # weight by w, not a 0/1 mask


def behavior_weights(
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: TISMode,
    cap: float,
    cap_min: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached importance weights [B, T] (1 off the mask) and their statistics.

    >>> old, mu, m = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.ones(1, 1)
    >>> round(float(behavior_weights(old, mu, m, "token_truncate", 2.0)[0]), 3)
    2.0
    """
    with torch.no_grad():
        mask = (mask > 0).float()  # a loss mask may carry weights (tree nodes): only where matters here
        log_w = (old_logprobs - behavior_logprobs) * mask  # [B, T]
        ones = torch.ones_like(log_w)
        if mode == "none":
            return ones, {}
        if mode in ("token_truncate", "token_mask"):
            w = torch.exp(log_w)
            hit = (w > cap) & mask.bool()
            w = w.clamp(max=cap) if mode == "token_truncate" else torch.where(hit, torch.zeros_like(w), w)
            n = mask.sum().clamp(min=1)
            stats = {f"tis/{'truncated' if mode == 'token_truncate' else 'masked'}_tokens": hit.sum() / n}
        elif mode in ("sequence_truncate", "sequence_mask"):
            seq_w = torch.exp(log_w.sum(-1))  # [B] Π w over each sequence's tokens
            if mode == "sequence_truncate":
                hit = seq_w > cap
                w = seq_w.clamp(max=cap)[:, None] * ones
            else:
                hit = (seq_w > cap) | (seq_w < cap_min)
                w = (~hit).float()[:, None] * ones
            has_tokens = mask.sum(-1) > 0
            n = has_tokens.sum().clamp(min=1)
            name = "truncated" if mode == "sequence_truncate" else "masked"
            stats = {f"tis/{name}_sequences": (hit & has_tokens).sum() / n}
        else:
            raise ValueError(f"tis_mode must be one of none, token_truncate, token_mask, sequence_truncate, "
                             f"sequence_mask; got {mode!r}")
        w = torch.where(mask.bool(), w, ones)
        stats["tis/weight_mean"] = (w * mask).sum() / mask.sum().clamp(min=1)
        return w, stats
