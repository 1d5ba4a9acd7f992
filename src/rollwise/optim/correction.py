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

The mismatch itself is measured every step, whatever the mode (``mismatch_metrics``; the
update logs them as ``mismatch/*``): on the sampled (trained) tokens, with
r = π_trainer/π_behaviour = exp(ℓ^old − ℓ^μ) per token —

- ``mismatch/abs_logprob_diff``: mean |ℓ^old − ℓ^μ|;
- ``mismatch/kl_k3``: mean(r − 1 − log r), Schulman's k3 estimator of KL(behaviour ‖ trainer):
  the tokens are drawn from the behaviour μ, and for x ~ q, r = p(x)/q(x), E_q[r − 1 − log r] =
  KL(q ‖ p) (unbiased, every term ≥ 0) — here q = μ, p = π_trainer;
- ``mismatch/ess``: (Σr)² / (n Σr²), the normalised effective sample size of the untruncated
  per-token weights (1 = no mismatch; small = a few tokens carry the weight);
- ``mismatch/truncated_frac`` (from ``behavior_weights``): the share of trained tokens the
  correction truncated or masked (a sequence mode's cut sequences count all their tokens).
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
        n_tokens = mask.sum().clamp(min=1)
        if mode == "none":
            return ones, {"mismatch/truncated_frac": torch.zeros(())}
        if mode in ("token_truncate", "token_mask"):
            w = torch.exp(log_w)
            hit = (w > cap) & mask.bool()
            cut = hit.sum() / n_tokens
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
            cut = (mask.sum(-1) * hit).sum() / n_tokens
        else:
            raise ValueError(f"tis_mode must be one of none, token_truncate, token_mask, sequence_truncate, "
                             f"sequence_mask; got {mode!r}")
        w = torch.where(mask.bool(), w, ones)
        stats["tis/weight_mean"] = (w * mask).sum() / n_tokens
        stats["mismatch/truncated_frac"] = cut
        return w, stats


def mismatch_metrics(trainer_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The behaviour-vs-trainer gap on the tokens of ``mask`` [B, T] (module docstring): mean
    |Δlog p|, k3 KL(behaviour ‖ trainer), normalised ESS of the per-token weights.

    >>> lp = torch.tensor([[-1.0, -2.0]])
    >>> float(mismatch_metrics(lp, lp, torch.ones(1, 2))["mismatch/kl_k3"])
    0.0
    """
    with torch.no_grad():
        mask = (mask > 0).to(trainer_logprobs.dtype)
        n = mask.sum().clamp(min=1)
        log_r = (trainer_logprobs - behavior_logprobs) * mask  # [B, T], 0 off the mask
        r = torch.exp(log_r)
        k3 = (r - 1 - log_r) * mask  # ≥ 0 per token; exp(0) − 1 − 0 = 0 off the mask anyway
        w, w2 = (r * mask).sum(), (r * r * mask).sum()
        ess = (w * w / (n * w2)) if float(mask.sum()) > 0 else torch.ones(())
        return {"mismatch/abs_logprob_diff": log_r.abs().sum() / n, "mismatch/kl_k3": k3.sum() / n,
                "mismatch/ess": ess}
