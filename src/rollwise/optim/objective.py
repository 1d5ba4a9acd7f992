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

from typing import Literal

import torch
from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.optim.advantages import (
    ScaleRewards,
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
from rollwise.optim.correction import IS_WEIGHT_MODES, TISMode, behavior_weights
from rollwise.optim.v05 import v05_advantages
from rollwise.optim.losses import (
    ISLevel,
    KLEstimator,
    LossAgg,
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

PRESETS: dict[str, dict] = {
    "grpo": {"scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "dr_grpo": {"scale_rewards": "none", "loss_agg": "seq_mean_token_sum_norm"},
    "ppo_clip": {"scale_rewards": "group", "loss_agg": "token_mean", "dual_clip": 3.0},
    # DAPO's loss side; ``dapo`` adds truncated-completion masking here and dynamic sampling in control
    "dapo_clip_higher": {"scale_rewards": "group", "loss_agg": "token_mean", "epsilon_high": 0.28,
                         "overlong_shaping": True},
    "dapo": {"scale_rewards": "group", "loss_agg": "token_mean", "epsilon_high": 0.28, "overlong_shaping": True,
             "mask_truncated_completions": True},
    "gspo": {"scale_rewards": "group", "loss_agg": "seq_mean_token_mean", "importance_sampling_level": "sequence",
             "epsilon": 3e-4, "epsilon_high": 4e-4},
    "rloo": {"advantage": "rloo", "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    "reinforce_pp_baseline": {"advantage": "reinforce_pp", "scale_rewards": "none", "loss_agg": "token_mean"},
    "cispo": {"policy_loss": "cispo", "scale_rewards": "group", "loss_agg": "token_mean", "epsilon_high": 0.28},
    "mc_grpo": {"advantage": "median", "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    "drpo": {"advantage": "drpo", "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    # r − b, b from a value probe on the policy's hidden states of the group's other rollouts (optim/poise.py)
    "poise": {"advantage": "poise", "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    # r − b, b = the group mean fused with a value prior V_0 (optim/v05.py); its control half fills control.method
    "v05": {"advantage": "v05", "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    # GRPO's pairwise form with look-alike pairs (4-gram Jaccard > .8) left out (optim/dagrpo.py)
    "dagrpo": {"advantage": "dagrpo", "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    # GRPO + GiGPO's step term on multi-turn episodes (Rollout.turns); exactly GRPO where no state repeats
    "gigpo": {"advantage": "gigpo", "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "sapo": {"policy_loss": "sapo", "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "minpro": {"prefix_ratio": True, "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "high_entropy_steps": {"top_entropy_quantile": 0.2, "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "ace": {"shaping": ["ace"], "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    "novelty_sharpen": {"shaping": ["novelty_sharpen"], "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    # ConciseR: GRPO++ (clip-higher, dynamic sampling in control), then L-GRPO's length term (optim/concise_r.py)
    "concise_r": {"scale_rewards": "group", "loss_agg": "token_mean", "epsilon_high": 0.28, "concise_r": True},
    # VCPO: A = r − b* (b* = Σw²r/Σw² per group), this step's lr × ESS/N of the sequence IS weights (optim/vcpo.py)
    "vcpo": {"advantage": "vcpo", "vcpo": True, "scale_rewards": "none", "loss_agg": "seq_mean_token_mean"},
    # the ratio against the trainer's log-probs of the version that sampled, tis on that/μ (optim/old_logits.py)
    "old_logit_repair": {"old_logit_repair": True, "scale_rewards": "group", "loss_agg": "token_mean",
                         "tis_mode": "token_truncate", "tis_cap": 2.0},
    # DPH-RL: + .05·(−mean ℓ^θ/|y|) over a pool of π_0's own samples, the gradient of KL(π_0‖π_θ) (optim/dph.py)
    "dph_rl": {"dph_coef": 0.05, "scale_rewards": "group", "loss_agg": "seq_mean_token_mean"},
    # AReaL's decoupled PPO: clip r = π_θ/π_prox, weight by sg(min(π_prox/μ, 2)) per token (train.mode=async)
    "decoupled_ppo": {"scale_rewards": "group", "loss_agg": "token_mean", "tis_mode": "token_truncate", "tis_cap": 2.0},
}
PRESETS["sapo_gate"] = PRESETS["sapo"]  # the catalogue's id for the same preset
# a preset that is a whole method fills other sections too, where the recipe leaves them unset
# (applied by rollwise.train.config with the other cross-section defaults)
PRESET_SECTIONS: dict[str, dict[str, dict]] = {"dapo": {"control": {"method": "dynamic_sampling"}},
                                                "v05": {"control": {"method": "v05"}}}  # the prior's test and extra rollouts
PRESET_SECTIONS["concise_r"] = {"control": {"method": "dynamic_sampling"}}  # GRPO++'s dynamic sampling
PRESET_SECTIONS["dagrpo"] = {"rollout": {"anchors": True}}  # DaGRPO's reference-solution anchors (generate/anchor.py)
# the correction a run that trains tokens sampled by older policies gets when neither its recipe nor
# its preset sets tis_mode: AReaL's decoupled PPO weight sg(min(pi_prox/mu, 2)) per token
STALE_TOKEN_OBJECTIVE = {"tis_mode": "token_truncate"}
Advantage = Literal["group", "rloo", "reinforce_pp", "median", "drpo", "gigpo", "poise", "dagrpo", "nudge", "v05", "vcpo"]


class ObjectiveConfig(StrictModel):
    """The loss: advantage estimator, policy-gradient surrogate, KL and off-policy weighting (a preset fills the rest)."""

    method: Literal[tuple(PRESETS)] = Field("grpo", description="preset of the fields below (`rollwise list objectives`)")
    advantage: Advantage = Field("group", description="estimator: group (GRPO, with scale_rewards), rloo, "
                                 "reinforce_pp (REINFORCE++-baseline), median (MC-GRPO: sample G+1), drpo, "
                                 "poise (r - a value probe's cross-rollout baseline), gigpo "
                                 "(GRPO + a per-turn anchor-state term), dagrpo (look-alike pairs left out), nudge (inter- and "
                                 "intra-context terms: rollout.strategy=nudge), vcpo (r - b*, b* from the sequence IS "
                                 "weights: needs vcpo=true)")
    shaping: list[Literal["ace", "novelty_sharpen"]] = Field([], description="advantage shaping after the estimator")
    scale_rewards: ScaleRewards | None = Field(None, description="advantage divisor: group std, batch std, or none")
    loss_agg: LossAgg | None = Field(None, description="how per-token losses reduce to a scalar")
    policy_loss: Literal["ppo", "cispo", "sapo"] = Field(
        "ppo", description="ppo: clipped surrogate; cispo: clipped IS weight x log-prob; sapo: soft gate")
    importance_sampling_level: ISLevel = Field("token", description="ratio per token, per sequence (GSPO) or "
                                               "sequence_token (GSPO-token)")
    epsilon: float = Field(0.2, ge=0, description="lower clip: ratio >= 1 - epsilon")
    epsilon_high: float | None = Field(None, ge=0, description="upper clip (DAPO clip-higher); default = epsilon")
    dual_clip: float | None = Field(None, gt=1, description="dual-clip PPO: negative-advantage loss at most -c*A")
    sapo_tau_pos: float = Field(1.0, gt=0, description="sapo gate temperature where A > 0")
    sapo_tau_neg: float = Field(1.05, gt=0, description="sapo gate temperature where A < 0")
    prefix_ratio: bool = Field(False, description="MinPRO: weight tokens by the prefix's minimum ratio (cap 2)")
    top_entropy_quantile: float = Field(1.0, gt=0, le=1, description="train only the top-q entropy tokens (TRL)")
    top_entropy_step_quantile: float = Field(
        1.0, gt=0, le=1, description="high_entropy_steps' step half (DART): train only the top-q entropy steps of "
        "the batch (an episode's turns; a rollout without turns is one step; entropy = mean -log mu of its tokens)")
    overlong_shaping: bool = Field(False, description="DAPO soft overlong punishment added to the reward "
                                   "(cache = max_new_tokens/5)")
    kl_in: Literal["loss", "reward"] = Field("loss", description="KL as a loss term (beta*k) or a per-token "
                                             "reward penalty (-beta*k1 on the advantage)")
    beta: float = Field(0.0, ge=0, description="KL coefficient against the frozen reference (0 = no reference model)")
    kl_estimator: KLEstimator = Field("k3", description="k1 | k2 | k3 estimator of KL(policy || reference)")
    prox_kl_coef: float = Field(0.0, ge=0, description="coefficient of k3 KL(policy || proximal) in the loss (ReMix's "
                                "KL-convex constraint with beta; filled from replay.remix.beta)")
    mask_truncated_completions: bool = Field(False, description="rollouts cut at max_new_tokens carry no gradient")
    tis_mode: TISMode = Field(
        "sequence_mask", description="behaviour-vs-trainer importance correction (tis_mis; TRL's "
        "vllm_importance_sampling_mode; none = off); runs with stale tokens (async k >= 1, replay, april) that "
        "leave it unset get token_truncate")
    tis_cap: float | None = Field(None, gt=0, description="IS cap C (default 3 for sequence modes, 2 for token modes)")
    tis_cap_min: float = Field(0.0, ge=0, description="sequence_mask also drops sequences with Π w below this")
    tree_adv: bool = Field(True, description="tree groups get tree advantages (tree_adv); a node shared by k "
                           "leaves is trained once with weight k")
    tree_mix: float = Field(0.5, ge=0, le=1, description="tree_adv weight of the fork-relative (local) term")
    gigpo_gamma: float = Field(0.95, ge=0, le=1, description="gigpo: discount of the per-turn returns z-scored "
                               "within anchor states")
    poise_hidden: int = Field(64, ge=1, description="poise: width of the value probe's hidden layer")
    poise_buffer: int = Field(4096, ge=1, description="poise: recent rollouts the value probe is fit on")
    poise_steps: int = Field(50, ge=1, description="poise: Adam steps per refit of the value probe (once a step)")
    poise_lr: float = Field(0.01, gt=0, description="poise: the value probe's learning rate")
    dagrpo_ngram: int = Field(4, ge=1, description="dagrpo: n of the token n-grams two completions are compared by")
    dagrpo_similarity: float = Field(0.8, ge=0, le=1, description="dagrpo: pairs whose n-gram Jaccard similarity "
                                     "is above this are not compared")
    nudge_inter: float = Field(0.5, ge=0, description="nudge: weight of the inter-context term r̄_k − r̄")
    nudge_distill: float = Field(0.1, ge=0, description="nudge: distillation weight added to the advantage of a "
                                 "correct response sampled under a non-empty context")
    concise_r: bool = Field(False, description="ConciseR's L-GRPO length term: from concise_r_start on, a group whose "
                            "rollouts are all correct gets r + w*(1 - |y|/max_new_tokens) (filter stage)")
    concise_r_weight: float = Field(0.5, ge=0, description="concise_r: w, the weight of the length term")
    concise_r_start: int = Field(0, ge=0, description="concise_r: the step stage 2 (the length term) starts at "
                                 "(0 = from the first step; the paper's stage 1 runs GRPO++ to convergence first)")
    vcpo: bool = Field(False, description="VCPO: each step's lr x ESS/N of the sequence importance weights "
                       "w = exp(sum(l_theta - l_mu)) and (advantage=vcpo) the baseline b* = sum(w^2 r)/sum(w^2) per group")
    vcpo_clamp: float = Field(5.0, gt=0, description="vcpo: the sequence log-weights are clamped to [-c, c]")
    old_logit_repair: bool = Field(False, description="keep the trainer's log-probs of the version that sampled each "
                                   "token (one no-grad forward per batch) and take the ratio against them; tis_mode "
                                   "weights them against the engine's")
    dph_coef: float = Field(0.0, ge=0, description="dph_rl: coefficient of the forward-KL rehearsal term "
                            "-mean(l_theta/|y|) over a pool of the initial policy's samples (0 = off; no reference model)")
    dph_pool: int = Field(64, ge=1, description="dph_rl: pool size, the run's first rollouts sampled entirely by version 0")
    dph_batch: int = Field(16, ge=1, description="dph_rl: pool items the term is computed on per optimizer pass")
    scope_sft_weight: float = Field(0.1, ge=0, description="scope: the advantage of the tokens a corrector wrote "
                                    "(Rollout.corrected_from on): an SFT term of this weight")

    @model_validator(mode="before")
    @classmethod
    def _fill_preset(cls, data):
        if isinstance(data, dict):
            preset = PRESETS.get(data.get("method", "grpo"), {})
            data = {**preset, **{k: v for k, v in data.items() if v is not None}}
            if data.get("tis_cap") is None:
                data["tis_cap"] = 2.0 if str(data.get("tis_mode", "")).startswith("token") else 3.0
        return data

    @model_validator(mode="after")
    def _vcpo_baseline(self):
        if self.advantage == "vcpo" and not self.vcpo:
            raise ValueError("objective.advantage=vcpo needs objective.vcpo=true (the trainer computes b* from the "
                             "importance weights only then); or use objective.method=vcpo")
        return self

    @property
    def corrects_off_policy(self) -> bool:
        """Valid on data sampled by an older policy (async, replay): the ratio is taken against the
        proximal policy (the weights before this update) and ``tis_mode`` *weights* the
        behaviour/proximal gap (the decoupled PPO objective of AReaL). ``sequence_mask`` does not:
        it keeps a stale sequence at weight 1 or drops it."""
        return self.tis_mode in IS_WEIGHT_MODES

    @property
    def needs_reference(self) -> bool:
        """A frozen reference model is needed: KL (beta > 0) or ACE's confidence shift."""
        return self.beta > 0 or "ace" in self.shaping


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
