"""Policy losses, loss aggregation and KL estimators: pure functions of tensors.

- ``ppo_clip``: the clipped surrogate of PPO ("Proximal Policy Optimization Algorithms",
  Schulman et al., 2017), with the asymmetric ``epsilon``/``epsilon_high`` of DAPO ("DAPO:
  An Open-Source LLM Reinforcement Learning System at Scale", Yu et al., 2025). A symmetric
  clip (``epsilon_high = epsilon``) is GRPO's loss.
- ``loss_agg``: ``token_mean`` (DAPO), ``seq_mean_token_mean`` (GRPO),
  ``seq_mean_token_sum_norm`` (Dr.GRPO: divide by a constant, no 1/|y| term).
- ``kl_estimators``: k1, k2, k3 of KL(π_θ‖π_ref) from samples of π_θ (Schulman, "Approximating
  KL Divergence", 2020); DeepSeekMath uses k3 in the loss.
- ``importance_ratio``: per token (PPO/GRPO), per sequence — GSPO ("Group Sequence Policy
  Optimization", Zheng et al., 2025): s_i = exp(mean_t(ℓ^θ − ℓ^old)) — or GSPO-token
  (sg(s_i)·exp(ℓ^θ_t − sg(ℓ^θ_t))).
- ``cispo_loss``: CISPO (MiniMax-M1, "Scaling Test-Time Compute Efficiently with Lightning
  Attention", 2025): −sg(min(ρ, 1+ε_high))·A·ℓ^θ — the IS weight is clipped, never the update,
  so every token keeps a gradient. No lower bound (our choice, as METHODS.md).
- ``sapo_loss``: SAPO ("Soft Adaptive Policy Optimization", 2025): −(4/τ)·σ(τ(ρ−1))·A with
  τ_pos for A > 0 and τ_neg for A < 0, a smooth gate instead of a hard clip (peers' form).
- ``prefix_min_ratio``: MinPRO ("A Step Back: Prefix Importance Ratio Stabilizes Policy
  Optimization"): weight m_t = min over earlier completion tokens of ρ_s (m = 1 at the first),
  capped at 2, detached.
- ``entropy_mask``: TRL's ``top_entropy_quantile`` (high-entropy minority tokens, "Beyond the
  80/20 Rule", Wang et al., 2025): keep the loss at tokens whose entropy is in the top
  ``quantile`` of the (micro-)batch's trained tokens.

Shapes: every per-token tensor is ``[B, T]`` over completion positions; ``completion_mask``
is 1 on sampled completion tokens and 0 on padding.
"""

from __future__ import annotations

from typing import Literal

import torch

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def token_weights(mask: torch.Tensor, loss_agg: LossAgg, max_len: int | None = None,
                  lengths: torch.Tensor | None = None, num_sequences: int | None = None) -> torch.Tensor:
    """Per-token weights [B, T] such that ``loss = Σ per_token · weights`` for ``loss_agg``.

    ``mask`` [B, T] holds the loss weights (0 = not trained: inserted tool ids, forced tokens,
    failed rollouts; k = a tree node shared by k leaves). Computed once on the whole batch, the
    weights make micro-batched gradient accumulation equal to the full-batch loss whatever the mode.

    - ``token_mean``: 1/Σm — the trained tokens only.
    - ``seq_mean_token_mean``: 1/(|y_i|·N), |y_i| = ``lengths`` [B] when given (the sampled
      length of the row's sequence: an episode's turns over all its segments; a tree leaf keeps
      its shared prefix), else Σm_i.
    - ``seq_mean_token_sum_norm``: 1/(N·max_len), ``max_len`` defaulting to T (pass the
      generation limit to make it a true constant, as Dr.GRPO does).

    N = ``num_sequences`` when given (an episode of several rows counts once, a failed one not
    at all: ``TrainBatch.num_sequences``), else B.

    >>> token_weights(torch.tensor([[1., 1, 0, 1], [1, 0, 0, 0]]), "seq_mean_token_mean", lengths=torch.tensor([3, 3]),
    ...               num_sequences=1).tolist()
    [[0.3333333432674408, 0.3333333432674408, 0.0, 0.3333333432674408], [0.3333333432674408, 0.0, 0.0, 0.0]]
    """
    mask = mask.float()
    n = max(mask.shape[0] if num_sequences is None else num_sequences, 1)
    if loss_agg == "token_mean":
        return mask / mask.sum().clamp(min=1)
    if loss_agg == "seq_mean_token_mean":
        per_seq = mask.sum(-1) if lengths is None else lengths.to(mask)
        return mask / (per_seq[:, None].clamp(min=1) * n)
    if loss_agg == "seq_mean_token_sum_norm":
        return mask / (n * (max_len or mask.shape[1]))
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
    return clipped_surrogate(torch.exp(policy_logprobs - old_logprobs), advantages, completion_mask,
                             epsilon=epsilon, epsilon_high=epsilon_high)


def clipped_surrogate(ratio, advantages, completion_mask, *, epsilon=0.2, epsilon_high=None, dual_clip=None):
    """PPO's per-token −min(ρ·A, clip(ρ)·A) for any ratio [B, T] (token or sequence level);
    ``dual_clip`` c bounds the loss of negative advantages by −c·A (dual-clip PPO)."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - epsilon, 1 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -dual_clip * adv), per_token)
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


ISLevel = Literal["token", "sequence", "sequence_token"]


def importance_ratio(policy_logprobs, old_logprobs, completion_mask, level: ISLevel = "token") -> torch.Tensor:
    """ρ [B, T] at the chosen level; a sequence's mean runs over its trained tokens."""
    if level == "token":
        return torch.exp(policy_logprobs - old_logprobs)
    trained = (completion_mask > 0).to(policy_logprobs.dtype)
    seq = ((policy_logprobs - old_logprobs) * trained).sum(-1) / trained.sum(-1).clamp(min=1)  # [B]
    s = torch.exp(seq)[:, None]
    if level == "sequence":
        return s.expand_as(policy_logprobs)
    if level == "sequence_token":
        return s.detach() * torch.exp(policy_logprobs - policy_logprobs.detach())
    raise ValueError(f"importance_sampling_level must be token, sequence or sequence_token, got {level!r}")


def cispo_loss(ratio, policy_logprobs, advantages, completion_mask, *, epsilon_high=0.28, epsilon=None):
    """Per-token −sg(clip(ρ, 1−ε, 1+ε_high))·A·ℓ^θ (no lower bound unless ``epsilon`` is given)."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    low = None if epsilon is None else 1 - epsilon
    weight = ratio.detach().clamp(min=low, max=1 + epsilon_high)
    mask = completion_mask.bool()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        metrics = {"clip_ratio/high": ((ratio > 1 + epsilon_high) & mask).sum() / n}
    return -weight * adv * policy_logprobs, metrics


def sapo_loss(ratio, advantages, completion_mask, *, tau_pos=1.0, tau_neg=1.05):
    """Per-token −(4/τ)·σ(τ(ρ−1))·A, τ = ``tau_pos`` where A > 0 else ``tau_neg``; dL/dρ = −4σ(1−σ)·A."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1))
    with torch.no_grad():
        mask = completion_mask.bool()
        weight = (4 * gate * (1 - gate))[mask]
        metrics = {"sapo/gate_weight": weight.mean() if weight.numel() else torch.tensor(0.0)}
    return -(4 / tau) * gate * adv, metrics


def prefix_min_ratio(ratio, completion_mask, cap: float = 2.0) -> torch.Tensor:
    """MinPRO weight [B, T]: min of ρ over the earlier trained tokens of the row (1 at the first), ≤ cap.

    >>> prefix_min_ratio(torch.tensor([[1.2, .8, 1.5, .9]]), torch.ones(1, 4)).tolist()
    [[1.0, 1.2000000476837158, 0.800000011920929, 0.800000011920929]]
    """
    with torch.no_grad():
        r = torch.where(completion_mask > 0, ratio.detach(), torch.full_like(ratio, float("inf")))
        before = torch.cat([torch.full_like(r[:, :1], float("inf")), r[:, :-1]], dim=1).cummin(dim=1).values
        m = torch.where(torch.isinf(before), torch.ones_like(before), before)
        return m.clamp(max=cap)


def entropy_mask(entropy, completion_mask, quantile: float) -> torch.Tensor:
    """1 at trained tokens whose entropy is in the top ``quantile`` of the trained tokens, else 0."""
    with torch.no_grad():
        trained = completion_mask > 0
        if quantile >= 1 or not trained.any():
            return trained.to(entropy.dtype)
        threshold = torch.quantile(entropy[trained].float(), 1 - quantile)
        return (trained & (entropy >= threshold)).to(entropy.dtype)
