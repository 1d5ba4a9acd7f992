"""Generate: the shape of the rollouts (how many, from where they branch).

Every strategy is a ``Generator`` (``generate/base.py``): ``generate(engine, prompts, budgets,
seed) -> (groups, metrics)`` (``budgets[i]`` rollouts or leaves for ``prompts[i]``), plus
``prompts_wanted(n)`` (fresh prompts it takes when a step needs ``n`` groups) and
``state_dict``/``load_state_dict`` (``{}`` for stateless strategies; APRIL's carry-over buffer
and TreePO's running entropy percentile otherwise), saved with every checkpoint.
"""

from __future__ import annotations

from rollwise.config import ConfigError
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.base import Generator

STRATEGIES = {
    "group": "independent samples, rollout.num_generations per prompt (GRPO's rollout)",
    "tree": "TreePO segment trees: fork at segment ends, leaves share prefixes (rollout.tree.*)",
    "latr": "LATR: branch at uncertain tokens, lookahead, prune similar branches (rollout.latr.*)",
    "april": "APRIL: over-provision groups, carry unfinished rollouts to the next step (rollout.april.*)",
    "guide": "Guide: groups that all failed get G/2 hinted rollouts, trained on the bare prompt with the IS "
             "weight (rollout.guide.*)",
    "nudge": "NudgeRL: each group split over K strategy contexts, trained on the bare prompt; inter/intra-context "
             "advantages + distillation (rollout.nudge.*)",
    "scope": "SCOPE: in groups that all failed, keep a rollout's steps before its first wrong one, the reference "
             "solution writes the rest (trained as SFT .1), kept if it verifies (rollout.scope.*)",
    "brorl": "BroRL: group sampling at large N (fills num_generations=128, prompts_per_step=2, max_batch_size=128, "
             "optim.micro_batch_size=16 where unset): statistics over all N, the loss in chunks",
}
# strategies whose rollouts are sampled under a context the trained prompt lacks (or written by a corrector):
# their behaviour log-probs are another distribution's, so the update needs a per-token IS weight (tis_mode)
GUIDED = ("guide", "nudge", "scope")
# rollout.environment (multi-turn episodes) replaces the strategy: generate/episode.py, built by train/build.py


def check_guidance(rollout, objective) -> None:
    """A guided strategy's rollouts need a per-token or sequence IS *weight* (``objective.tis_mode``): a 0/1 mask
    or none would train them as if sampled from the bare prompt."""
    if rollout.strategy in GUIDED and objective.tis_mode not in ("token_truncate", "token_mask", "sequence_truncate"):
        raise ConfigError(f"rollout.strategy={rollout.strategy} trains rollouts sampled under a context the prompt "
                          f"lacks, but objective.tis_mode={objective.tis_mode} does not weight them by "
                          "π(y|x)/π(y|x⊕h); drop objective.tis_mode (it then defaults to token_truncate, cap 2) "
                          "or set it to token_truncate, token_mask or sequence_truncate")


def sampling_params(rollout, tokenizer) -> SamplingParams:
    """Training rollouts' sampling settings (``rollout.*``, a ``RolloutConfig``), stopping at the
    tokenizer's EOS."""
    return SamplingParams(rollout.temperature, rollout.top_p, rollout.top_k, rollout.max_new_tokens,
                          (tokenizer.eos_token_id,))


def build_generator(rollout, params, decode, pruner=None, gate=None, gate_every: int = 0, encode=None) -> Generator:
    """The generator ``rollout.strategy`` names, configured from ``rollout`` (a ``RolloutConfig``).

    ``pruner`` (a controller that prunes inside generation, e.g. ``arrol``) turns independent
    sampling into ``PrunedSampler``: over-provisioned samples, pruned at a segment boundary.
    ``gate(partial) -> bool`` (a controller's ``should_continue``), asked every ``gate_every``
    tokens of a rollout, stops rollouts during ``group`` sampling. ``encode(prompt) -> ids`` (the
    trainer's tokenizer) lets ``nudge`` put its contexts into the prompts."""
    from rollwise.generate.april import AprilSampler
    from rollwise.generate.group import GroupSampler
    from rollwise.generate.guide import GuideSampler
    from rollwise.generate.nudge import NudgeSampler
    from rollwise.generate.scope import ScopeSampler
    from rollwise.generate.latr import LatrSampler
    from rollwise.generate.pruned import PrunedSampler
    from rollwise.generate.tree import TreeSampler

    flat = ("group", "guide", "nudge", "scope", "brorl")  # group sampling underneath
    if rollout.anchors and (pruner is not None or rollout.strategy not in flat):
        raise ConfigError("rollout.anchors (DaGRPO's reference-solution anchors; objective.method=dagrpo turns them "
                          f"on) add a rollout to a flat group, not to rollout.strategy={rollout.strategy}"
                          + (" or a pruning controller" if pruner else "") + "; set rollout.anchors=false")
    if gate is not None and (pruner is not None or rollout.strategy not in flat):
        raise ConfigError(f"a controller that stops rollouts during generation (should_continue) works with "
                          f"rollout.strategy=group, not {rollout.strategy}"
                          + (" or a pruning controller" if pruner else "") + "; set rollout.strategy=group")
    if pruner is not None:
        sampler = PrunedSampler(params, decode, pruner, pruner.over_provision, pruner.segment_len)
        pruner.features = sampler.features
        return sampler

    if rollout.strategy == "tree":
        return TreeSampler(params, decode, rollout.tree)
    if rollout.strategy == "latr":
        return LatrSampler(params, decode, rollout.latr)
    if rollout.strategy == "april":
        return AprilSampler(params, decode, rollout.april, target=rollout.prompts_per_step)
    if rollout.strategy == "nudge":
        if encode is None:
            raise ConfigError("rollout.strategy=nudge puts its contexts into the prompts and needs the trainer's "
                              "tokenizer; with rollout.workers use rollout.workers=0")
        return NudgeSampler(params, decode, gate=gate, gate_every=gate_every, nudge=rollout.nudge, encode=encode,
                            anchors=rollout.anchors)
    if rollout.strategy == "scope":
        return ScopeSampler(params, decode, gate=gate, gate_every=gate_every, scope=rollout.scope,
                            group_size=rollout.num_generations, anchors=rollout.anchors)
    if rollout.strategy == "guide":
        return GuideSampler(params, decode, gate=gate, gate_every=gate_every, guide=rollout.guide,
                            group_size=rollout.num_generations, anchors=rollout.anchors)
    return GroupSampler(params, decode, gate=gate, gate_every=gate_every, anchors=rollout.anchors)

