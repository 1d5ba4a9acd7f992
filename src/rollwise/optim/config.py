"""What an objective is: ``ObjectiveConfig`` (the ``objective`` section of a run config) and the
presets that fill it — ``PRESETS`` (each method id's fields), ``PRESET_SECTIONS`` (the other
sections a whole method fills) and ``STALE_TOKEN_OBJECTIVE``. How an objective computes its
advantages and loss from these fields: ``rollwise.optim.objective``, whose docstring describes
the general form every preset is a point of.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.optim.advantages import ScaleRewards
from rollwise.optim.correction import IS_WEIGHT_MODES, TISMode
from rollwise.optim.losses import ISLevel, KLEstimator, LossAgg

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
