"""Advantage shaping after the estimator: pure functions of per-rollout tensors [N].

Both functions take the sequence-level advantages the estimator produced (one per rollout)
and return reshaped, detached advantages plus a dict of scalar metrics. No gradient flows
through the shaping (METHODS.md conventions: advantages are detached).

- ``ace``: "Overconfident Errors Need Stronger Correction: Asymmetric Confidence Penalties"
  (ACE). The confidence shift c = log π_θ(y|x) − log π_ref(y|x) scales negative advantages, so
  an error the policy has grown more confident in than the reference is pushed down harder:
  for A < 0, A ← A·(1 + max(ĉ, 0)); A ≥ 0 is unchanged.
  Departures: ĉ = c/|y|, the per-token shift rather than the raw sequence sum (the sum grows
  with length and would make long errors explode); c is detached.

- ``novelty_sharpen``: XRPO ("XRPO: Pushing the limits of GRPO with Targeted Exploration and
  Exploitation", Bamba et al., 2025), novelty-aware advantage sharpening: amplify correct
  responses the policy found unlikely, using sequence likelihood. Our choice (METHODS.md):
  among a group's correct rollouts (``rollwise.types.is_correct``), and only when the group has at
  least 2 of them, z is the z-score of the per-token NLL over those correct rollouts (Bessel
  std + 1e-6), and A ← A·(1 + strength·clip(z, 0, z_max)), strength .5 and z_max 2 by
  default. Wrong rollouts and groups with fewer than 2 correct rollouts are unchanged; the
  multiplier lies in [1, 1 + strength·z_max].
"""

from __future__ import annotations

import torch

from rollwise.optim.advantages import EPS, as_correct, group_stats


def ace(
    advantages: torch.Tensor,
    seq_logratio: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ACE-shaped advantages [N] and metrics.

    ``seq_logratio`` [N] is Σ_t (ℓ^θ − ℓ^ref) over each rollout's response tokens;
    ``lengths`` [N] is |y| (clamped to ≥ 1). ĉ = seq_logratio/|y|.

    >>> ace(torch.tensor([-1.0, -1.0]), torch.tensor([5.0, -2.0]), torch.tensor([10, 10]))[0]
    tensor([-1.5000, -1.0000])
    """
    with torch.no_grad():
        adv = advantages.detach()
        adv = adv if adv.is_floating_point() else adv.float()
        c_hat = seq_logratio.detach().to(adv.dtype) / lengths.detach().to(adv.dtype).clamp(min=1)
        negative = adv < 0
        mult = torch.where(negative, 1 + c_hat.clamp(min=0), torch.ones_like(adv))
        shaped = adv * mult
        n_neg = negative.sum()
        scaled = negative & (c_hat > 0)
        metrics = {
            "ace/confidence_mean": c_hat.mean() if c_hat.numel() else c_hat.new_zeros(()),
            "ace/scaled_frac": scaled.sum() / max(int(n_neg), 1),
            "ace/neg_multiplier_mean": (mult * negative).sum() / max(int(n_neg), 1),
        }
        return shaped, metrics


def novelty_sharpen(
    advantages: torch.Tensor,
    correct: torch.Tensor,
    nll: torch.Tensor,
    group_ids: torch.Tensor,
    strength: float = 0.5,
    z_max: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Novelty-sharpened advantages [N] and metrics.

    ``nll`` [N] is each rollout's per-token NLL, −Σ_t ℓ_t/|y|; ``group_ids`` [N] its prompt
    group; ``correct`` [N] says which rollouts the verifiers judged correct (a bool tensor, or
scores judged by ``rollwise.types.is_correct``).

    >>> a, _ = novelty_sharpen(torch.ones(3), torch.ones(3), torch.tensor([.2, .6, .4]), torch.zeros(3))
    >>> [round(float(x), 4) for x in a]
    [1.0, 1.5, 1.0]
    """
    with torch.no_grad():
        adv = advantages.detach()
        adv = adv if adv.is_floating_point() else adv.float()
        nll = nll.detach().to(adv.dtype)
        correct = as_correct(correct.detach())
        # statistics over each group's correct rollouts only
        idx = correct.nonzero().squeeze(-1)
        mean, std = group_stats(nll[idx], group_ids[idx])
        _, inverse, count = torch.unique(group_ids[idx], return_inverse=True, return_counts=True)
        z = ((nll[idx] - mean) / (std + EPS)).to(adv.dtype)
        eligible = torch.zeros_like(correct)
        eligible[idx] = count[inverse] >= 2
        mult = torch.ones_like(adv)
        mult[idx] = torch.where(eligible[idx], 1 + strength * z.clamp(0, z_max), mult[idx])
        shaped = adv * mult
        n_elig = eligible.sum()
        metrics = {
            "novelty/eligible_frac": n_elig / max(adv.numel(), 1),
            "novelty/multiplier_mean": (mult * eligible).sum() / max(int(n_elig), 1),
            "novelty/amplified_frac": (eligible & (mult > 1)).sum() / max(int(n_elig), 1),
        }
        return shaped, metrics
