"""An objective = advantage estimator + ratio + clip + aggregation + KL term.

Methods are presets of one general form, not branches of a switch: ``grpo`` is group
scaling + symmetric clip + ``seq_mean_token_mean``; ``dr_grpo`` drops the std scaling and
the 1/|y| term; ``ppo_clip`` is the clipped surrogate on group-baseline advantages with
``token_mean``. A preset only fills the fields a recipe leaves unset, and the resolved
values are what ``config.yaml`` records. Names follow TRL's ``GRPOConfig`` where it has one
(``scale_rewards``, ``epsilon``, ``epsilon_high``, ``beta``, ``mask_truncated_completions``).

Two parts compose with every preset: the advantage estimator switches to ``tree_adv`` for
groups that carry a tree (``rollout.strategy=tree|latr``; ``tree_adv=false`` keeps flat
group advantages), and ``tis_mode`` corrects the behaviour/trainer mismatch (``tis_mis``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.optim.advantages import ScaleRewards, group_advantages, reward_scale, tree_node_advantages
from rollwise.optim.correction import TISMode, behavior_weights
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
    tis_mode: TISMode = Field(
        "sequence_mask", description="behaviour-vs-trainer importance correction (tis_mis; TRL's "
        "vllm_importance_sampling_mode; none = off)")
    tis_cap: float | None = Field(None, gt=0, description="IS cap C (default 3 for sequence modes, 2 for token modes)")
    tis_cap_min: float = Field(0.0, ge=0, description="sequence_mask also drops sequences with Π w below this")
    tree_adv: bool = Field(True, description="tree groups get tree advantages (tree_adv); a node shared by k "
                           "leaves is trained once with weight k")
    tree_mix: float = Field(0.5, ge=0, le=1, description="tree_adv weight of the fork-relative (local) term")

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data):
        if isinstance(data, dict):
            preset = PRESETS.get(data.get("method", "grpo"), {})
            data = {**preset, **{k: v for k, v in data.items() if v is not None}}
            if data.get("tis_cap") is None:
                data["tis_cap"] = 2.0 if str(data.get("tis_mode", "")).startswith("token") else 3.0
        return data


def assign_advantages(groups: list[RolloutGroup], cfg: ObjectiveConfig) -> dict[str, float]:
    """Set each rollout's per-token advantage: its sequence advantage on every token, or for
    tree groups (``cfg.tree_adv``) each node's tree advantage on that node's tokens."""
    rewards = torch.tensor([r.reward for g in groups for r in g.rollouts], dtype=torch.float64)
    group_ids = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.rollouts])
    adv = group_advantages(rewards, group_ids, cfg.scale_rewards).tolist()
    scale = reward_scale(rewards, group_ids, cfg.scale_rewards).tolist()
    i = 0
    for g in groups:
        n = len(g.rollouts)
        if g.tree is not None and cfg.tree_adv:
            assign_tree_advantages(g, scale[i] if n else 1.0, cfg.tree_mix)
        else:
            for r, a in zip(g.rollouts, adv[i : i + n]):
                r.advantage = [a] * len(r.completion_ids)
        i += n
    zero = sum(1 for g in groups if len({r.reward for r in g.rollouts}) <= 1)
    token_adv = [abs(a) for g in groups for r in g.rollouts
                 for a, m in zip(r.advantage, r.loss_mask or [1] * len(r.advantage)) if m]  # trained tokens
    return {"advantage/abs_mean": sum(map(abs, adv)) / max(len(adv), 1),
            "advantage/token_abs_mean": sum(token_adv) / max(len(token_adv), 1),
            "groups/zero_signal": zero / max(len(groups), 1)}


def assign_tree_advantages(group: RolloutGroup, scale: float, mix: float) -> None:
    """``tree_adv`` on one tree group: node advantages / ``scale`` on each node's tokens.

    A node shared by k leaves is trained once, in the first of them, with loss weight k
    (``Rollout.loss_mask`` = k there, 0 in the other leaves): the weight its tokens would get
    from k flat GRPO rollouts, computed once. With ``mix = 0`` and equal leaf lengths this is
    exactly GRPO on the leaves; the local (fork-relative) term is what the tree adds."""
    tree = group.tree
    parents = {n.id: n.parent for n in tree.nodes}
    node_adv = tree_node_advantages(parents, [r.node_path[-1] for r in group.rollouts],
                                    [r.reward for r in group.rollouts], mix)
    leaves_below: dict[int, int] = {}
    for r in group.rollouts:
        for node_id in r.node_path:
            leaves_below[node_id] = leaves_below.get(node_id, 0) + 1
    trained: set[int] = set()
    for r in group.rollouts:
        advantage = [0.0] * len(r.completion_ids)
        mask = list(r.loss_mask) if r.loss_mask is not None else [1] * len(r.completion_ids)
        for node_id in r.node_path[1:]:
            node = tree.nodes[node_id]
            weight = 0 if node_id in trained else leaves_below[node_id]
            for t in range(node.start, node.end):
                advantage[t] = node_adv[node_id] / scale
                mask[t] *= weight
            trained.add(node_id)
        r.advantage, r.loss_mask = advantage, mask


def policy_loss(
    policy_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    loss_weights: torch.Tensor,
    cfg: ObjectiveConfig,
    ref_logprobs: torch.Tensor | None = None,
    behavior_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one (micro-)batch: Σ per-token loss · ``loss_weights``.

    All inputs are [B, T]; ``loss_weights`` comes from ``token_weights(mask, cfg.loss_agg)``
    on the whole batch, so micro-batch losses add up to the full-batch loss. With
    ``behavior_logprobs`` (the engine's), the policy term is weighted by ``tis_mode``.
    """
    per_token, metrics = ppo_clip_loss(
        policy_logprobs, old_logprobs, advantages, completion_mask, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high
    )
    if behavior_logprobs is not None and cfg.tis_mode != "none":
        weights, stats = behavior_weights(old_logprobs, behavior_logprobs, completion_mask, cfg.tis_mode,
                                          cfg.tis_cap, cfg.tis_cap_min)
        per_token = per_token * weights
        metrics |= stats
    if cfg.beta > 0:
        if ref_logprobs is None:
            raise ValueError("objective.beta > 0 needs reference log-probs")
        kl = kl_penalty(policy_logprobs, ref_logprobs, cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
        metrics["kl"] = aggregate(kl.detach(), completion_mask, "token_mean")
    return (per_token * loss_weights).sum(), metrics
