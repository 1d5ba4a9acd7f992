"""Control: where the rollout budget goes, what continues, what stops (DESIGN.md, Control).

A ``Controller`` (``control/base.py``) is built from ``control.method`` with its options under
``control.<method>.*`` and called by the loop at fixed points: ``select_prompts``,
``allocate``, ``extend``, ``should_continue``, ``accept``. ``PromptStats``
(``control/stats.py``) keeps per-prompt running statistics; both are saved in checkpoints
(``controller.pt``). ``control.method: none`` is the loop without control: the next prompts of
the stream, ``num_generations`` rollouts each, every group trained.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.control.arrol import ArrolConfig
from rollwise.control.base import Controller, PromptCursor
from rollwise.control.clpo import ClpoConfig
from rollwise.control.dars import DarsConfig
from rollwise.control.difficulty import DifficultyConfig
from rollwise.control.dynamic_sampling import DynamicSamplingConfig
from rollwise.control.gdro import GdroConfig
from rollwise.control.masa import MasaConfig
from rollwise.control.stats import PromptStats
from rollwise.control.trace import TraceConfig
from rollwise.control.v05 import V05Config
from rollwise.control.vade import VadeConfig
from rollwise.control.xrpo import XrpoConfig

__all__ = ["CONTROLLERS", "EPISODES_ONLY", "ControlConfig", "Controller", "PromptCursor", "PromptStats",
           "build_controller"]

CONTROLLERS = {
    "none": "no control: the next prompts, num_generations rollouts each, every group trained",
    "dynamic_sampling": "DAPO: drop zero-variance groups, refill with fresh prompts (cap: max_rounds)",
    "vade": "VADE: Thompson-sample prompts from a Beta posterior by P(group not all-equal)",
    "xrpo_alloc": "XRPO: n0 rollouts per prompt, the rest in chunks where uncertainty falls most",
    "gdro": "GDRO: bandit over pass@k difficulty bins (prompt) and sqrt(p(1-p)) rollouts (rollout)",
    "dars": "DARS: extra G-rollout rounds for hard prompts until G/2 correct or 4G (breadth: DARS-B)",
    "difficulty_select": "sample prompts by estimated a(1-a), a from attention over rolled-out references",
    "arrol": "ARRoL: start 2G, prune to G at a segment by a probe on hidden states (balanced survivors)",
    "trace": "TRACE (episodes): G/2 episodes, the rest restarted from turn prefixes of highest p(1-p)/(1+n)",
    "masa": "MASA: the policy predicts its pass rate and correct length; calibrated, skip p̂ < .05 or > .95, cut at 2L̂",
    "clpo": "CLPO: an accuracy-EMA curriculum; a share of each step rewrites seen medium (restated) and hard "
            "(a given added) prompts, answer kept; a rewrite whose first 4 rollouts agree is dropped",
    "v05": "V0.5 (objective.method=v05 fills it): test each group against its prior V_0, n more rollouts if rejected, "
           "the fused baseline on the rollouts",
}

EPISODES_ONLY = ("trace",)  # controllers that allocate over the turns of multi-turn episodes (rollout.environment)


class ControlConfig(StrictModel):
    method: Literal[tuple(CONTROLLERS)] = Field("none", description="the controller (`rollwise list controllers`)")
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig,
                                                    description="method=dynamic_sampling (DAPO) options")
    vade: VadeConfig = Field(default_factory=VadeConfig, description="method=vade options")
    xrpo_alloc: XrpoConfig = Field(default_factory=XrpoConfig, description="method=xrpo_alloc options")
    gdro: GdroConfig = Field(default_factory=GdroConfig, description="method=gdro options")
    dars: DarsConfig = Field(default_factory=DarsConfig, description="method=dars (DARS, DARS-B) options")
    difficulty_select: DifficultyConfig = Field(default_factory=DifficultyConfig,
                                                description="method=difficulty_select options")
    arrol: ArrolConfig = Field(default_factory=ArrolConfig, description="method=arrol options")
    trace: TraceConfig = Field(default_factory=TraceConfig, description="method=trace options")
    masa: MasaConfig = Field(default_factory=MasaConfig, description="method=masa (MASA) options")
    clpo: ClpoConfig = Field(default_factory=ClpoConfig, description="method=clpo (CLPO's curriculum) options")
    v05: V05Config = Field(default_factory=V05Config, description="method=v05 (V0.5's prior test; objective.method=v05)")


def check_composition(control: ControlConfig, rollout) -> None:
    """Refuse combinations that make no sense, naming the fields and the fix."""
    m = control.method
    if m == "none":
        return
    if rollout.strategy == "april":
        raise ConfigError(f"control.method={m} with rollout.strategy=april: APRIL carries unfinished groups across "
                          "steps, so a step's prompts and budgets are not the controller's to choose; use "
                          "rollout.strategy=group or tree (or control.method=none)")
    if m == "arrol" and rollout.strategy != "group":
        raise ConfigError(f"control.method=arrol with rollout.strategy={rollout.strategy}: arrol over-provisions and "
                          "prunes independent samples; set rollout.strategy=group")
    if m == "arrol" and rollout.engine == "v1":
        raise ConfigError("control.method=arrol prunes inside generation and needs the slot engine; set "
                          "rollout.engine=slots or auto (Llama/Qwen2/Mistral models)")
    if m in EPISODES_ONLY and rollout.environment is None:
        raise ConfigError(f"control.method={m} allocates rollouts over the turns of multi-turn episodes; set "
                          "rollout.environment (e.g. guess_number, calculator) or choose another control.method")
    g = rollout.num_generations
    if m == "xrpo_alloc" and control.xrpo_alloc.initial > g:
        n0 = control.xrpo_alloc.initial
        raise ConfigError(f"control.xrpo_alloc.initial={n0} exceeds rollout.num_generations={g}: "
                          "the first phase would spend more than the step's budget; lower control.xrpo_alloc.initial "
                          "or raise rollout.num_generations")
    if m == "gdro" and control.gdro.mode != "prompt" and control.gdro.min_rollouts > g:
        raise ConfigError(f"control.gdro.min_rollouts={control.gdro.min_rollouts} exceeds rollout.num_generations={g}: "
                          "the minimums alone exceed the step's budget; lower control.gdro.min_rollouts")
    if m in ("dynamic_sampling", "xrpo_alloc", "gdro", "dars", "trace") and g < 2:
        raise ConfigError(f"control.method={m} needs groups of at least 2 rollouts to see a spread; "
                          "set rollout.num_generations >= 2")


def build_controller(control: ControlConfig, rollout, seed: int, embed=None, meta=None, rewrite=None) -> Controller:
    """The controller ``control.method`` names (``embed``: prompts -> normalised embeddings, for
    difficulty_select; ``meta``: prompts -> the policy's (p̂, L̂), for masa; ``rewrite``: clpo's rewriter,
    ``tasks/rewrites.py``)."""
    from rollwise.control.arrol import Arrol
    from rollwise.control.dars import Dars
    from rollwise.control.difficulty import DifficultySelect
    from rollwise.control.dynamic_sampling import DynamicSampling
    from rollwise.control.gdro import Gdro
    from rollwise.control.trace import Trace
    from rollwise.control.vade import Vade
    from rollwise.control.xrpo import XrpoAlloc

    check_composition(control, rollout)
    kw = {"seed": seed, "num_generations": rollout.num_generations}
    m = control.method
    if m == "dynamic_sampling":
        return DynamicSampling(control.dynamic_sampling, **kw)
    if m == "vade":
        return Vade(control.vade, **kw)
    if m == "xrpo_alloc":
        return XrpoAlloc(control.xrpo_alloc, **kw)
    if m == "gdro":
        return Gdro(control.gdro, **kw)
    if m == "dars":
        return Dars(control.dars, **kw)
    if m == "difficulty_select":
        return DifficultySelect(control.difficulty_select, embed=embed, **kw)
    if m == "arrol":
        return Arrol(control.arrol, max_new_tokens=rollout.max_new_tokens, **kw)
    if m == "trace":
        return Trace(control.trace, **kw)
    if m == "v05":
        from rollwise.control.v05 import V05

        return V05(control.v05, **kw)
    if m == "clpo":
        from rollwise.control.clpo import Clpo

        return Clpo(control.clpo, rewrite=rewrite, **kw)
    if m == "masa":
        from rollwise.control.masa import Masa

        return Masa(control.masa, predict=meta, **kw)
    return Controller(**kw)
