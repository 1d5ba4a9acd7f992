"""Policy losses, loss aggregation and KL estimators: pure functions of tensors.

- ``ppo_clip``: the clipped surrogate of PPO ("Proximal Policy Optimization Algorithms",
  Schulman et al., 2017), with the asymmetric ``epsilon``/``epsilon_high`` of DAPO ("DAPO:
  An Open-Source LLM Reinforcement Learning System at Scale", Yu et al., 2025). A symmetric
  clip (``epsilon_high = epsilon``) is GRPO's loss.
- ``loss_agg``: ``token_mean`` (DAPO), ``seq_mean_token_mean`` (GRPO),
  ``seq_mean_token_sum_norm`` (Dr.GRPO: divide by a constant, no 1/|y| term).
- ``kl_estimators``: k1, k2, k3 of KL(π_θ‖π_ref) from samples of π_θ (Schulman, "Approximating
  KL Divergence", 2020); DeepSeekMath uses k3 in the loss.

Shapes: every per-token tensor is ``[B, T]`` over completion positions; ``completion_mask``
is 1 on sampled completion tokens and 0 on padding.
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def token_weights(mask: torch.Tensor, loss_agg: LossAgg, max_len: int | None = None,
                  lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights [B, T] such that ``loss = Σ per_token · weights`` for ``loss_agg``.

    Computed once on the whole batch, the weights make micro-batched gradient accumulation
    equal to the full-batch loss whatever the mode.

    - ``token_mean``: 1/Σm.
    - ``seq_mean_token_mean``: 1/(|y_i|·N), |y_i| = ``lengths`` [B] when given (a sequence
      with untrained tokens — shared tree prefixes, forced tokens — keeps its length), else Σm_i.
    - ``seq_mean_token_sum_norm``: 1/(N·max_len), ``max_len`` defaulting to T (pass the
      generation limit to make it a true constant, as Dr.GRPO does).
    """
    mask = mask.float()
    if loss_agg == "token_mean":
        return mask / mask.sum().clamp(min=1)
    if loss_agg == "seq_mean_token_mean":
        per_seq = mask.sum(-1) if lengths is None else lengths.to(mask)
        return mask / (per_seq[:, None].clamp(min=1) * mask.shape[0])
    if loss_agg == "seq_mean_token_sum_norm":
        return mask / (mask.shape[0] * (max_len or mask.shape[1]))
    raise ValueError(f"loss_agg must be token_mean, seq_mean_token_mean or seq_mean_token_sum_norm, got {loss_agg!r}")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: LossAgg, max_len: int | None = None):
    """Reduce a per-token loss [B, T] to a scalar under ``mask`` [B, T] (see ``token_weights``)."""
    return (per_token * token_weights(mask, loss_agg, max_len).to(per_token.dtype)).sum()


def ppo_clip_loss(
    policy_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate loss [B, T] and clip statistics.

    L = −min(ρ·A, clip(ρ, 1−ε, 1+ε_high)·A), ρ = exp(ℓ^θ − ℓ^old). advantages: [B] (one
    per sequence) or [B, T].
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(policy_logprobs - old_logprobs)  # [B, T]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - epsilon, 1 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    mask = completion_mask.bool()
    with torch.no_grad():
        low = (ratio < 1 - epsilon) & (adv < 0) & mask
        high = (ratio > 1 + eps_high) & (adv > 0) & mask
        n = mask.sum().clamp(min=1)
        metrics = {"clip_ratio/low": low.sum() / n, "clip_ratio/high": high.sum() / n}
    return per_token, metrics


def kl_penalty(policy_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"):
    """Per-token estimate of KL(π_θ‖π_ref) [B, T], with δ = ℓ^ref − ℓ^θ.

    k1 = −δ, k2 = δ²/2, k3 = e^δ − 1 − δ.
    """
    delta = ref_logprobs - policy_logprobs
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    if estimator == "k3":
        return torch.exp(delta) - 1 - delta
    raise ValueError(f"kl estimator must be k1, k2 or k3, got {estimator!r}")
