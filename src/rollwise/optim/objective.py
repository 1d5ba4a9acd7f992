"""An objective = advantage estimator + ratio + clip + aggregation + KL term.

Methods are presets of one general form, not branches of a switch: ``grpo`` is group
scaling + symmetric clip + ``seq_mean_token_mean``; ``dr_grpo`` drops the std scaling and
the 1/|y| term; ``ppo_clip`` is the clipped surrogate on group-baseline advantages with
``token_mean``. A preset only fills the fields a recipe leaves unset, and the resolved
values are what ``config.yaml`` records. Names follow TRL's ``GRPOConfig`` where it has one
(``scale_rewards``, ``epsilon``, ``epsilon_high``, ``beta``, ``mask_truncated_completions``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.optim.advantages import ScaleRewards, group_advantages
from rollwise.optim.losses import KLEstimator, LossAgg, aggregate, kl_penalty, ppo_clip_loss
from rollwise.types import RolloutGroup

PRESETS: dict[str, dict] = {
    "grpo": {"scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "dr_grpo": {"scale_rewards": "none", "loss_agg": "seq_mean_token_sum_norm"},
    "ppo_clip": {"scale_rewards": "group", "loss_agg": "token_mean"},
}


class ObjectiveConfig(StrictModel):
    method: Literal["grpo", "dr_grpo", "ppo_clip"] = Field("grpo", description="preset of the fields below")
    scale_rewards: ScaleRewards | None = Field(None, description="advantage divisor: group std, batch std, or none")
    loss_agg: LossAgg | None = Field(None, description="how per-token losses reduce to a scalar")
    epsilon: float = Field(0.2, ge=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(None, ge=0, description="upper clip (DAPO clip-higher); default = epsilon")
    beta: float = Field(0.0, ge=0, description="KL coefficient against the frozen reference (0 = no reference model)")
    kl_estimator: KLEstimator = Field("k3", description="k1 | k2 | k3 estimator of KL(policy || reference)")
    mask_truncated_completions: bool = Field(False, description="rollouts cut at max_new_tokens carry no gradient")

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data):
        if isinstance(data, dict):
            preset = PRESETS.get(data.get("method", "grpo"), {})
            data = {**preset, **{k: v for k, v in data.items() if v is not None}}
        return data


def assign_advantages(groups: list[RolloutGroup], cfg: ObjectiveConfig) -> dict[str, float]:
    """Set each rollout's per-token advantage (its sequence advantage on every token)."""
    rewards = torch.tensor([r.reward for g in groups for r in g.rollouts], dtype=torch.float64)
    group_ids = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.rollouts])
    adv = group_advantages(rewards, group_ids, cfg.scale_rewards).tolist()
    rollouts = [r for g in groups for r in g.rollouts]
    for r, a in zip(rollouts, adv):
        r.advantage = [a] * len(r.completion_ids)
    zero = sum(1 for g in groups if len({r.reward for r in g.rollouts}) <= 1)
    return {"advantage/abs_mean": sum(map(abs, adv)) / max(len(adv), 1), "groups/zero_signal": zero / max(len(groups), 1)}


def policy_loss(
    policy_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    loss_weights: torch.Tensor,
    cfg: ObjectiveConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one (micro-)batch: Σ per-token loss · ``loss_weights``.

    All inputs are [B, T]; ``loss_weights`` comes from ``token_weights(mask, cfg.loss_agg)``
    on the whole batch, so micro-batch losses add up to the full-batch loss.
    """
    per_token, metrics = ppo_clip_loss(
        policy_logprobs, old_logprobs, advantages, completion_mask, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high
    )
    if cfg.beta > 0:
        if ref_logprobs is None:
            raise ValueError("objective.beta > 0 needs reference log-probs")
        kl = kl_penalty(policy_logprobs, ref_logprobs, cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
        metrics["kl"] = aggregate(kl.detach(), completion_mask, "token_mean")
    return (per_token * loss_weights).sum(), metrics
