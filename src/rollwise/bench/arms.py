"""What an arm of the ablation ledger is: the grammar ``bench ablate``'s ``arms`` are written in.

An arm is ``<stage>:<id>`` — ``objective:<preset>``, ``strategy:<id>``, ``control:<id>``,
``replay:<id>``, ``reward:<id>`` (``rewards=[{name: <id>}]``) — and changes exactly one config
line of the baseline (GRPO, independent group sampling, no control, no replay, the task's reward).
``<stage>:<id>@<regime>`` measures it in an off-policy regime (``REGIMES``: ``epochs2`` = two
optimizer passes per batch, ``async1`` = async with staleness 1, ``replay`` = rollout replay)
against the baseline in that regime (``baseline@<regime>``); ``regime:<regime>`` is the regime
itself (the baseline there) against the baseline (e.g. ``regime:async1``: what going async costs).
Arms join with ``+`` into one arm (``objective:dapo+control:vade``); ``set:<key>=<value>`` joins
any other config line, for an arm at a setting its paper recommends
(``control:xrpo_alloc+set:control.xrpo_alloc.bonus=0.1``). Default arms (``default_arms()``): every
method id implemented, plus, in each of the regimes asked for, every objective preset that differs
from GRPO only in fields that act through the importance ratio (``ratio_presets()``: at one
optimizer pass, on fresh samples, the ratio is 1 and those fields do nothing). The ``noise_floor``
arm is the baseline again with other rollout-sampling seeds (``sampling_seed``; same warm start,
data order and eval set).
"""

from __future__ import annotations

from rollwise.bench.harness import NOISE_FLOOR, NOISE_SEED_OFFSET
from rollwise.config import ConfigError

BASELINE = "baseline"
STAGE_KEYS = {"objective": "objective.method", "strategy": "rollout.strategy", "control": "control.method",
              "replay": "replay.method", "reward": "rewards"}  # reward:<name> = rewards=[{name: <name>}]
# reward ids measured as arms (the task's verifier replaced; a task the reward does not score refuses the arm)
REWARD_ARMS = ("fapo", "majority_vote", "pow3r", "weaver")
# what an arm needs besides its one line (method-specific requirements)
ARM_EXTRAS = {"objective:mc_grpo": ["rollout.num_generations=7"],
              # BroRL: the baseline's rollouts per step as one group of N = 128 (the bench sets G and prompts)
              "strategy:brorl": ["rollout.num_generations=128", "rollout.prompts_per_step=1",
                                 "optim.micro_batch_size=16"],
              "reward:majority_vote": ["task.labels=none"]}  # label-free: training never sees the answers
# off-policy regimes: where the ratio pi_theta / pi_old departs from 1 (async also sets its threads, in _run)
REGIMES = {"epochs2": ["optim.num_iterations=2"], "async1": ["train.mode=async", "train.max_staleness=1"],
           "replay": ["replay.method=rollout_replay"]}
# ObjectiveConfig fields that act only through the importance ratio: inert at ratio 1
RATIO_FIELDS = ("policy_loss", "importance_sampling_level", "epsilon", "epsilon_high", "dual_clip", "sapo_tau_pos",
                "sapo_tau_neg", "prefix_ratio", "tis_mode", "tis_cap", "tis_cap_min", "vcpo",
                "old_logit_repair")


def distinct_presets() -> list[str]:
    """Objective preset ids but ``grpo``, each preset once (an alias such as dapo_clip_higher = dapo: its first id)."""
    from rollwise.optim.config import PRESETS

    seen: dict[int, str] = {}
    for name, preset in PRESETS.items():
        if name != "grpo":
            seen.setdefault(id(preset), name)
    return list(seen.values())


def ratio_presets() -> list[str]:
    """Objective presets that differ from GRPO's resolved config in a ratio-only field (``RATIO_FIELDS``):
    the ones that can differ from an on-policy run only off-policy (aliases once)."""
    from rollwise.optim.config import ObjectiveConfig

    grpo = ObjectiveConfig(method="grpo").model_dump()
    return [name for name in distinct_presets()
            if any(ObjectiveConfig(method=name).model_dump()[f] != grpo[f] for f in RATIO_FIELDS)]


def default_arms(regimes: list[str] = ("epochs2", "async1")) -> list[str]:
    """Every implemented method id, as ``stage:id`` (baselines and aliases left out), then the
    ratio presets in each off-policy regime (``objective:<id>@<regime>``)."""
    from rollwise.control import CONTROLLERS, EPISODES_ONLY
    from rollwise.generate import STRATEGIES
    from rollwise.replay import REPLAY_METHODS

    return ([f"objective:{n}" for n in distinct_presets()] + [f"strategy:{n}" for n in STRATEGIES if n != "group"]
            + [f"control:{n}" for n in CONTROLLERS if n != "none" and n not in EPISODES_ONLY]  # single-turn tasks
            + [f"replay:{n}" for n in REPLAY_METHODS if n != "none"] + [f"reward:{n}" for n in REWARD_ARMS]
            + [f"objective:{n}@{r}" for r in regimes for n in ratio_presets()])


def split_arm(arm: str) -> tuple[str, str | None]:
    """``objective:cispo@epochs2`` -> (``objective:cispo``, ``epochs2``); no regime -> None."""
    body, _, regime = arm.partition("@")
    return body, regime or None


def baseline_of(arm: str) -> str:
    """The arm an arm is compared with: the baseline in its regime (the noise floor: the baseline)."""
    regime = split_arm(arm)[1]
    return BASELINE if regime is None else f"{BASELINE}@{regime}"


def arm_lines(arm: str) -> list[str]:
    """The config lines an arm changes from the baseline (the noise floor's is its sampling seed)."""
    body, regime = split_arm(arm)
    if body == BASELINE:
        lines = []
    elif body == NOISE_FLOOR:
        lines = [f"sampling_seed=seed+{NOISE_SEED_OFFSET}"]  # seed_sets gives the number
    else:
        lines = []
        for part in body.split("+"):
            stage, _, name = part.partition(":")
            if stage == "set":
                lines.append(name)
            else:
                lines += REGIMES[name] if stage == "regime" else [stage_line(stage, name), *ARM_EXTRAS.get(part, [])]
    return lines + (REGIMES[regime] if regime else [])


def stage_line(stage: str, name: str) -> str:
    """The config line of ``stage:name`` (``reward:fapo`` → ``rewards=[{name: fapo}]``)."""
    return f"rewards=[{{name: {name}}}]" if stage == "reward" else f"{STAGE_KEYS[stage]}={name}"


def check_arm(arm: str) -> None:
    """Refuse an arm that is not in the grammar, naming the part and the fix (ConfigError)."""
    body, _, regime = arm.partition("@")
    for part in body.split("+"):
        stage, _, name = part.partition(":")
        if stage == "set" and "=" not in name:
            raise ConfigError(f"arms: {arm!r}: {part!r} is not set:key=value (e.g. set:control.xrpo_alloc.bonus=0.1)")
        if (stage not in (*STAGE_KEYS, "regime", "set") or not name) and body != BASELINE:
            raise ConfigError(f"arms: {arm!r} is not stage:id; stages are {', '.join(STAGE_KEYS)}, regime "
                              "(e.g. objective:dapo, control:vade, objective:cispo@epochs2, regime:async1, "
                              "objective:dapo+control:vade)")
        if stage == "regime" and name not in REGIMES:
            raise ConfigError(f"arms: {arm!r}: unknown regime {name!r}; regimes are {', '.join(REGIMES)}")
    if "@" in arm and regime not in REGIMES:
        raise ConfigError(f"arms: {arm!r}: unknown regime {regime!r}; regimes are {', '.join(REGIMES)}")
