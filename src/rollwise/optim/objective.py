"""An objective = advantage estimator (+ shaping) + ratio form + clip/gate + weights +
aggregation + KL term.

Methods are presets of one general form, not branches of a switch: ``grpo`` is group
scaling + symmetric clip + ``seq_mean_token_mean``; ``dr_grpo`` drops the std scaling and
the 1/|y| term; ``dapo_clip_higher`` is clip-higher + ``token_mean`` + overlong shaping, and
``dapo`` the whole method — that plus truncated-completion masking here and dynamic sampling,
which the run config turns on in ``control`` (``rollwise.train.config``); ``gspo`` the
sequence-level ratio with the paper's tiny clip; ``cispo`` and ``sapo`` swap the clip for a
clipped IS weight or a soft gate; ``rloo``, ``reinforce_pp_baseline``, ``mc_grpo``, ``drpo``,
``dagrpo`` (GRPO without its look-alike pairs) swap the advantage estimator, and ``gigpo`` adds a
per-turn term to multi-turn episodes' tokens; ``ace`` and ``novelty_sharpen`` shape advantages;
``minpro`` weights tokens by the prefix's minimum ratio; ``high_entropy_steps`` keeps the
high-entropy tokens. A preset only
fills the fields a recipe leaves unset, and the resolved values are what ``config.yaml``
records. Names follow TRL's ``GRPOConfig`` where it has one (``scale_rewards``, ``epsilon``,
``epsilon_high``, ``beta``, ``mask_truncated_completions``, ``importance_sampling_level``,
``top_entropy_quantile``).

Two parts compose with every preset: the advantage estimator switches to ``tree_adv`` for
groups that carry a tree (``rollout.strategy=tree|latr``; ``tree_adv=false`` keeps flat
group advantages), and ``tis_mode`` corrects the behaviour/trainer mismatch (``tis_mis``);
where a run trains on stale tokens (async, replay, APRIL) and neither the recipe nor the preset
sets ``tis_mode``, the run config makes it ``token_truncate`` (decoupled PPO).
"""

from __future__ import annotations

import torch

from rollwise.optim.advantages import (
    drpo_advantages,
    gigpo_advantages,
    group_advantages,
    is_zero_signal,
    median_advantages,
    reinforce_pp_advantages,
    reward_scale,
    rloo_advantages,
    tree_node_advantages,
)
from rollwise.optim.batch import episode_tokens
from rollwise.optim.dagrpo import dagrpo_advantages
from rollwise.optim.config import PRESETS, ObjectiveConfig  # noqa: F401 (PRESETS: re-exported, the method ids)
from rollwise.optim.correction import behavior_weights
from rollwise.optim.v05 import v05_advantages
from rollwise.optim.losses import (
    aggregate,
    cispo_loss,
    clipped_surrogate,
    entropy_mask,
    importance_ratio,
    kl_penalty,
    prefix_min_ratio,
    sapo_loss,
)
from rollwise.types import RolloutGroup


def assign_advantages(groups: list[RolloutGroup], cfg: ObjectiveConfig) -> dict[str, float]:
    """Set each rollout's per-token advantage: its sequence advantage on every token; for tree
    groups (``cfg.tree_adv``) each node's tree advantage on that node's tokens; with ``gigpo``, a
    multi-turn episode's turn tokens get A^E + that turn's A^S (``token_advantages``).

    A failed rollout (``Rollout.failure``) is left out of its group's statistics — the
    estimator sees the group without it — and gets advantage 0 (``build_batch`` gives it loss
    weight 0): a group [1, 0, failed, 1] trains exactly as the group [1, 0, 1]."""
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float64)
    group_ids = torch.tensor([gi for gi, g in enumerate(groups) for _ in g.rollouts])
    adv, excluded, steps, metrics = live_advantages(rollouts, rewards, group_ids, cfg)
    adv = adv.tolist()
    trees = cfg.tree_adv and any(g.tree is not None for g in groups)
    scale = reward_scale(rewards, group_ids, cfg.scale_rewards).tolist() if trees else None  # tree_adv's divisor
    i = 0
    for g in groups:
        n = len(g.rollouts)
        if g.tree is not None and cfg.tree_adv:
            assign_tree_advantages(g, scale[i] if n else 1.0, cfg.tree_mix)
        else:
            for j, r in enumerate(g.rollouts, start=i):
                if adv[j] > 0:  # majority_vote: a confident pseudo-label's positives count less (× 1 − share)
                    adv[j] *= r.positive_advantage_scale
                r.advantage = token_advantages(r, adv[j], steps[j])
                if r.corrected_from is not None:  # scope: the corrector's tokens train as SFT at this weight
                    r.advantage[r.corrected_from:] = [cfg.scope_sft_weight] * (len(r.advantage) - r.corrected_from)
                for s in r.segments or ():  # a harness episode's other segments: its sequence advantage
                    s.advantage = [adv[j]] * len(s.completion_ids)
                if excluded[j]:  # MC-GRPO's pivot, a failed rollout: no gradient
                    r.loss_weights = [0] * len(r.completion_ids)
        i += n
    zero = sum(1 for g in groups if is_zero_signal(g.live_rewards))
    token_adv = [abs(a) for g in groups for r in g.rollouts if r.failure is None
                 for a, m in zip(r.advantage, r.loss_weights or [1] * len(r.advantage)) if m]  # trained tokens
    adv = [a for a, r in zip(adv, rollouts) if r.failure is None]
    return metrics | {"advantage/abs_mean": sum(map(abs, adv)) / max(len(adv), 1),
            "advantage/token_abs_mean": sum(token_adv) / max(len(token_adv), 1),
            "groups/zero_signal": zero / max(len(groups), 1)}


def token_advantages(rollout, advantage: float, step: list[float] | None) -> list[float]:
    """Per completion token: ``advantage`` on every token, or (``step``: GiGPO's A^S, one per
    ``rollout.turns``) ``advantage`` + A^S on each turn's tokens and 0 on the tokens the environment
    inserted between turns (they carry loss weight 0: not trained)."""
    n = len(rollout.completion_ids)
    if step is None:
        return [advantage] * n
    out = [0.0] * n
    for turn, a in zip(rollout.turns, step, strict=True):
        if not 0 <= turn.start <= turn.end <= n:
            raise ValueError(f"rollout of prompt {rollout.prompt_id}: turn [{turn.start}, {turn.end}) is outside "
                             f"its {n} completion tokens")
        out[turn.start : turn.end] = [advantage + a] * (turn.end - turn.start)
    return out


def _correct(rollouts) -> torch.Tensor:
    return torch.tensor([r.correct for r in rollouts], dtype=torch.bool)


def _median(rollouts, rewards, group_ids, cfg):
    return (*median_advantages(rewards, group_ids), None)  # the pivots get no gradient


def _poise(rollouts, rewards, group_ids, cfg):
    """r − b, b the value probe's cross-rollout baseline the trainer set (``optim/poise.py``)."""
    from rollwise.optim.poise import poise_advantages

    if any(r.value_baseline is None for r in rollouts):
        raise ValueError("objective.advantage=poise needs each rollout's value_baseline (the Trainer's value probe "
                         "sets it: optim.poise.ValueBaseline.assign)")
    return poise_advantages(rewards, torch.tensor([r.value_baseline for r in rollouts], dtype=rewards.dtype))


def _vcpo(rollouts, rewards):
    """r − b*, b* the group's minimum-variance baseline the trainer set (``objective.vcpo``, ``optim/vcpo.py``)."""
    if any(r.value_baseline is None for r in rollouts):
        raise ValueError("objective.advantage=vcpo needs each rollout's value_baseline (objective.vcpo=true: the "
                         "Trainer sets b* before the advantages: optim.vcpo.assign_vcpo)")
    return rewards.double() - torch.tensor([r.value_baseline for r in rollouts], dtype=torch.float64)


def _gigpo(rollouts, rewards, group_ids, cfg):
    """A^E [N] and A^S per turn (None for a rollout without turns: plain GRPO)."""
    turns = [r.turns for r in rollouts]
    step_rewards = [None if ts is None else [t.reward for t in ts] for ts in turns]
    states = [None if ts is None else [t.state for t in ts] for ts in turns]
    episode, step = gigpo_advantages(rewards, group_ids, step_rewards, states, cfg.gigpo_gamma, cfg.scale_rewards)
    return episode, None, step


# estimator name -> (rollouts, rewards [N], group_ids [N], cfg) -> advantages [N], or
# (advantages [N], excluded [N] bool or None, per-turn step term or None): MC-GRPO's pivots, GiGPO's A^S
ESTIMATORS = {
    "group": lambda ro, r, g, cfg: group_advantages(r, g, cfg.scale_rewards),
    "rloo": lambda ro, r, g, cfg: rloo_advantages(r, g),
    # token counts and lengths are sampled tokens (an episode's turns over its segments, not inserted ids)
    "reinforce_pp": lambda ro, r, g, cfg: reinforce_pp_advantages(
        r, g, torch.tensor([max(episode_tokens(x), 1) for x in ro])),
    "median": _median,
    "drpo": lambda ro, r, g, cfg: drpo_advantages(
        _correct(ro), torch.tensor([float(episode_tokens(x)) for x in ro]), g),
    "gigpo": _gigpo,
    "poise": _poise,
    "dagrpo": lambda ro, r, g, cfg: dagrpo_advantages(r, g, [x.completion_ids for x in ro], cfg.scale_rewards,
                                                      cfg.dagrpo_ngram, cfg.dagrpo_similarity),
    "nudge": lambda ro, r, g, cfg: _nudge(ro, r, g, cfg),
    "v05": lambda ro, r, g, cfg: v05_advantages(ro, r, g),  # Rollout.value_baseline from control.method=v05
    "vcpo": lambda ro, r, g, cfg: _vcpo(ro, r),  # Rollout.value_baseline from control.method=v05
}


def _nudge(rollouts, rewards, group_ids, cfg):
    """NudgeRL's advantage (``optim/nudge.py``): cells are (group, ``Rollout.context``)."""
    from rollwise.optim.nudge import nudge_advantages

    cells: dict[tuple, int] = {}
    cell = [cells.setdefault((int(g), r.context), len(cells)) for g, r in zip(group_ids, rollouts)]
    distill = torch.tensor([r.context is not None and r.correct for r in rollouts])
    return nudge_advantages(rewards, group_ids, torch.tensor(cell), distill, cfg.nudge_inter, cfg.nudge_distill)


def live_advantages(rollouts, rewards: torch.Tensor, group_ids: torch.Tensor, cfg: ObjectiveConfig):
    """``sequence_advantages`` of the rollouts that did not fail, as if the failed ones had never
    been sampled; a failed one gets advantage 0, no step term, and is excluded."""
    live = [i for i, r in enumerate(rollouts) if r.failure is None]
    n = len(rollouts)
    adv, excluded, steps = torch.zeros(n, dtype=torch.float64), [True] * n, [None] * n
    if not live:
        return adv, excluded, steps, {}
    if len(live) == n:
        return sequence_advantages(rollouts, rewards, group_ids, cfg)
    index = torch.tensor(live)
    sub_adv, sub_excluded, sub_steps, metrics = sequence_advantages(
        [rollouts[i] for i in live], rewards[index], group_ids[index], cfg)
    adv[index] = sub_adv
    for j, i in enumerate(live):
        excluded[i], steps[i] = sub_excluded[j], sub_steps[j]
    return adv, excluded, steps, metrics


def sequence_advantages(rollouts, rewards: torch.Tensor, group_ids: torch.Tensor, cfg: ObjectiveConfig):
    """(advantage [N], excluded [N] bool, step terms [N] (a list per turn, or None), metrics) of flat
    rollouts: the estimator, then shaping (of the sequence advantage)."""
    out = ESTIMATORS[cfg.advantage](rollouts, rewards, group_ids, cfg)
    adv, excluded, steps = out if isinstance(out, tuple) else (out, None, None)
    excluded = torch.zeros(len(rollouts), dtype=torch.bool) if excluded is None else excluded
    steps = [None] * len(rollouts) if steps is None else steps
    metrics: dict[str, float] = {}
    if cfg.advantage == "gigpo":
        flat = [a for s in steps if s is not None for a in s]
        metrics["gigpo/turns_with_step_signal"] = sum(a != 0 for a in flat) / max(len(flat), 1)
        metrics["gigpo/step_abs_mean"] = sum(map(abs, flat)) / max(len(flat), 1)
    if "novelty_sharpen" in cfg.shaping:
        from rollwise.optim.shaping import novelty_sharpen

        nll = torch.tensor([-sum(r.behavior_logprobs) / max(r.num_tokens, 1) for r in rollouts])
        adv, m = novelty_sharpen(adv, _correct(rollouts), nll, group_ids)
        metrics |= {k: float(v) for k, v in m.items()}
    return adv.double(), excluded.tolist(), steps, metrics


def assign_tree_advantages(group: RolloutGroup, scale: float, mix: float) -> None:
    """``tree_adv`` on one tree group: node advantages / ``scale`` on each node's tokens.

    A node shared by k leaves is trained once, in the first of them, with loss weight k
    (``Rollout.loss_weights`` = k there, 0 in the other leaves): the weight its tokens would get
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
        mask = list(r.loss_weights) if r.loss_weights is not None else [1] * len(r.completion_ids)
        for node_id in r.node_path[1:]:
            node = tree.nodes[node_id]
            weight = 0 if node_id in trained else leaves_below[node_id]
            for t in range(node.start, node.end):
                advantage[t] = node_adv[node_id] / scale
                mask[t] *= weight
            trained.add(node_id)
        r.advantage, r.loss_weights = advantage, mask


def _ppo(ratio, policy_logprobs, advantages, mask, cfg):
    return clipped_surrogate(ratio, advantages, mask, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
                             dual_clip=cfg.dual_clip)


def _cispo(ratio, policy_logprobs, advantages, mask, cfg):
    return cispo_loss(ratio, policy_logprobs, advantages, mask,
                      epsilon_high=cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high)


def _sapo(ratio, policy_logprobs, advantages, mask, cfg):
    return sapo_loss(ratio, advantages, mask, tau_pos=cfg.sapo_tau_pos, tau_neg=cfg.sapo_tau_neg)


POLICY_LOSSES = {"ppo": _ppo, "cispo": _cispo, "sapo": _sapo}


def policy_loss(
    policy_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    trained_mask: torch.Tensor,
    loss_weights: torch.Tensor,
    cfg: ObjectiveConfig,
    ref_logprobs: torch.Tensor | None = None,
    behavior_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one (micro-)batch: Σ per-token loss · ``loss_weights``.

    All inputs are [B, T]; ``trained_mask`` (0/1) marks the tokens that carry a loss (ratios,
    clip statistics and KL are computed there); ``loss_weights`` comes from
    ``token_weights(batch.loss_weights, cfg.loss_agg)`` on the whole batch, so micro-batch
    losses add up to the full-batch loss. The policy term
    is ``cfg.policy_loss`` on the ratio at ``cfg.importance_sampling_level``, then weighted
    by MinPRO's prefix ratio, ``tis_mode`` (with ``behavior_logprobs``) and the entropy mask
    (with ``entropy``); the KL term is added in the loss or, ``kl_in=reward``, subtracted from
    the advantage as a per-token k1 penalty. ``prox_kl_coef`` adds k3 KL(π_θ‖π_old) against the
    proximal log-probs ``old_logprobs`` (ReMix; 0 on the first pass over a batch, where θ = old).
    """
    if cfg.beta > 0 and ref_logprobs is None:
        raise ValueError("objective.beta > 0 needs reference log-probs")
    if cfg.beta > 0 and cfg.kl_in == "reward":
        advantages = advantages - cfg.beta * (old_logprobs - ref_logprobs).detach()  # −β·k1 per token
    ratio = importance_ratio(policy_logprobs, old_logprobs, trained_mask, cfg.importance_sampling_level)
    per_token, metrics = POLICY_LOSSES[cfg.policy_loss](ratio, policy_logprobs, advantages, trained_mask, cfg)
    if cfg.prefix_ratio:
        per_token = per_token * prefix_min_ratio(ratio, trained_mask)
    if behavior_logprobs is not None and cfg.tis_mode != "none":
        weights, stats = behavior_weights(old_logprobs, behavior_logprobs, trained_mask, cfg.tis_mode,
                                          cfg.tis_cap, cfg.tis_cap_min)
        per_token = per_token * weights
        metrics |= stats
    if cfg.top_entropy_quantile < 1 and entropy is not None:
        keep = entropy_mask(entropy.detach(), trained_mask, cfg.top_entropy_quantile)
        per_token = per_token * keep
        metrics["entropy_mask/kept"] = keep.sum() / (trained_mask > 0).sum().clamp(min=1)
    if cfg.beta > 0 and cfg.kl_in == "loss":
        kl = kl_penalty(policy_logprobs, ref_logprobs, cfg.kl_estimator)
        per_token = per_token + cfg.beta * kl
        metrics["kl"] = aggregate(kl.detach(), trained_mask, "token_mean")
    elif cfg.beta > 0:
        metrics["kl"] = aggregate((policy_logprobs - ref_logprobs).detach(), trained_mask, "token_mean")
    if cfg.prox_kl_coef > 0:  # ReMix: the proximal half of β[½KL(π_θ‖π_old) + ½KL(π_θ‖π_ref)], k3
        kl_prox = kl_penalty(policy_logprobs, old_logprobs.detach(), "k3")
        per_token = per_token + cfg.prox_kl_coef * kl_prox
        metrics["kl_prox"] = aggregate(kl_prox.detach(), trained_mask, "token_mean")
    return (per_token * loss_weights).sum(), metrics
