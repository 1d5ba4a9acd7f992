"""``RunConfig``: one recipe, composed of the config classes kept next to each component.

Some settings fill keys of another section where the recipe leaves them unset — ``FILLS``
below lists every one (ReMix's KL terms, the stale-token correction, DAPO's dynamic sampling);
the values live with the component that needs them and the resolved ``config.yaml`` shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from rollwise.config import ConfigError, StrictModel, apply_overrides, load_yaml, validate
from rollwise.control import ControlConfig
from rollwise.replay import ReplayConfig, remix_objective, replay_serves_stored_groups
from rollwise.filter.judge import JudgeConfig
from rollwise.filter.pow3r import Pow3rConfig
from rollwise.filter.soft_verify import TestThresholdConfig
from rollwise.filter.weaver import WeaverConfig
from rollwise.filter.majority_vote import MajorityVoteConfig
from rollwise.filter.sandbox.config import SandboxConfig
from rollwise.generate import GUIDED, STRATEGIES
from rollwise.generate.april import AprilConfig
from rollwise.generate.brorl import fill_brorl
from rollwise.generate.guide import GuideConfig
from rollwise.generate.nudge import NUDGE_OBJECTIVE, NudgeConfig
from rollwise.generate.scope import ScopeConfig
from rollwise.generate.latr import LatrConfig
from rollwise.generate.tree import TreeConfig
from rollwise.model.load import ModelConfig
from rollwise.optim.config import PRESET_SECTIONS, PRESETS, STALE_TOKEN_OBJECTIVE, ObjectiveConfig
from rollwise.tasks.arith import ArithConfig
from rollwise.tasks.labels import check_labels
from rollwise.tasks.registry import TaskConfig
from rollwise.train.metrics import check_loggers


class SFTConfig(StrictModel):
    """The supervised warm start on the task's demonstrations before RL (0 steps = none)."""

    steps: int = Field(0, ge=0, description="supervised warm-start steps on the task's demonstrations (0 = none)")
    batch_size: int = Field(64, ge=1, description="demonstrations per SFT step")
    lr: float = Field(1e-3, gt=0, description="SFT learning rate (AdamW, linear warmup over the first 20 steps, then "
                      "constant: a warm start of fewer steps never reaches it)")


class WorkerResources(StrictModel):
    """What one rollout worker (a Ray actor) reserves; its torch threads = ``num_cpus`` (at least 1)."""

    num_cpus: float = Field(1, gt=0, description="CPU cores per worker (also its torch thread count)")
    num_gpus: float = Field(0, ge=0, description="GPUs per worker (> 0: its engine runs on CUDA)")
    memory: int | None = Field(None, ge=1, description="bytes of memory Ray reserves per worker (null = none)")
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per worker")


class RolloutConfig(StrictModel):
    """How rollouts are sampled: strategy, group size, prompts per step, sampling settings, engine, workers."""

    strategy: Literal[tuple(STRATEGIES)] = Field("group",
                                                 description="how rollouts are shaped (`rollwise list strategies`)")
    num_generations: int = Field(8, ge=1, description="rollouts per prompt (TRL's num_generations)")
    prompts_per_step: int = Field(16, ge=1, description="prompts sampled per training step")
    temperature: float = Field(1.0, gt=0, description="sampling temperature for training rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1 = off)")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_new_tokens: int = Field(128, ge=1, description="completion length limit (finish_reason 'length' beyond)")
    max_batch_size: int = Field(256, ge=1, description="sequences the engine decodes at once (its slots)")
    engine: Literal["auto", "slots", "v1"] = Field(
        "auto", description="slots: continuous batching + fork/pause (Llama/Qwen2/Mistral); v1: any HF model; auto"
    )
    engine_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the precision the engine samples in, from its own copy of the weights (the trainer keeps "
        "fp32): auto = bf16 on a CPU with native bf16 (AVX-512 BF16, AMX) where a one-off benchmark at the model's "
        "shapes finds it faster, or on CUDA with bf16; else fp32 (docs/engine.md#precision)")
    mismatch_kl_bound: float = Field(
        0.01, gt=0, description="past this k3 KL(behaviour || trainer) per sampled token (mismatch/kl_k3) a run "
        "sampling below fp32 warns, and with engine_dtype=auto falls back to fp32")
    tree: TreeConfig = Field(default_factory=TreeConfig, description="strategy=tree (TreePO) options")
    latr: LatrConfig = Field(default_factory=LatrConfig, description="strategy=latr (LATR) options")
    april: AprilConfig = Field(default_factory=AprilConfig, description="strategy=april (APRIL) options")
    guide: GuideConfig = Field(default_factory=GuideConfig, description="strategy=guide (Guide) options")
    nudge: NudgeConfig = Field(default_factory=NudgeConfig, description="strategy=nudge (NudgeRL) options")
    scope: ScopeConfig = Field(default_factory=ScopeConfig, description="strategy=scope (SCOPE) options")
    anchors: bool = Field(False, description="DaGRPO's off-policy anchors: a group with at most one correct rollout "
                          "gets the task's reference solution as one more rollout if it verifies (r = 1, ratio 1); "
                          "objective.method=dagrpo turns it on (generate/anchor.py)")
    workers: int = Field(0, ge=0, description="rollout workers: N Ray actors, each with its own engine, generate and "
                         "score the step's prompts (0 = in-process; pip install 'rollwise[ray]'; dist/)")
    worker_resources: WorkerResources = Field(default_factory=WorkerResources,
                                              description="what each rollout worker reserves on the Ray cluster")
    worker_restarts: int = Field(3, ge=0, description="rollout workers restarted after a crash, over the run; "
                                 "their prompts are re-issued to the others either way")
    environment: str | None = Field(
        None, description="multi-turn episodes: an environment class (TRL's environment_factory shape: reset(**row), "
        "its public methods are tools, optional get_reward) as package.module:Class, or a built-in: python_tool, "
        "calculator, guess_number, or an OpenEnv server as openenv:http://HOST:PORT (null = one completion per rollout; "
        "docs/environments.md)")
    harness: str | None = Field(
        None, description="agent-harness episodes: an `async def rollout(client, row) -> float | None` as "
        "package.module:function that talks to the policy through the openai client it is given (an endpoint the run "
        "serves on 127.0.0.1); its calls are trained token-faithfully (pip install 'rollwise[serve]'; docs/serve.md)")
    harness_timeout: float = Field(300.0, gt=0, description="seconds a harness episode may run before it scores 0 "
                                   "(its unfinished requests are aborted)")
    harness_max_segments: int = Field(16, ge=1, description="segments a harness episode may start (a call that "
                                      "rewrites its history, or each extra choice of n > 1, starts one); a call past "
                                      "it ends the episode, as rollout.max_new_tokens does")
    tool_format: Literal["auto", "hermes", "plain"] = Field(
        "auto", description="how a turn calls tools: hermes (<tool_call>{json}</tool_call>, results through the chat "
        "template), plain (<call>name(args)</call>, results as <result>..</result>), auto = hermes with a chat template")
    max_turns: int = Field(4, ge=1, description="model turns per episode (rollout.max_new_tokens bounds its tokens, "
                           "sampled and inserted together)")
    tool_timeout: float = Field(10.0, gt=0, description="seconds a tool call may run before the model is told it "
                                "timed out")
    tool_output_chars: int = Field(2000, ge=1, description="characters of a tool's result shown to the model (the "
                                   "rest is cut, saying how much)")
    score_on: Literal["workers", "driver"] = Field(
        "workers", description="with rollout.workers: where reward functions run (workers = in parallel, each with "
        "its own sandbox; driver = in the training process)")


class OptimConfig(StrictModel):
    """The optimizer and the update: AdamW, schedule, micro-batches, passes, the packed forward."""

    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping norm")
    warmup_steps: int = Field(0, ge=0, description="linear LR warmup steps")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="LR schedule after warmup")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final LR / lr for cosine and linear schedules")
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward (gradient accumulation)")
    num_iterations: int = Field(1, ge=1, description="optimizer passes over each batch (TRL's num_iterations)")
    skip_zero_advantage: bool = Field(True, description="skip the forward/backward of rollouts whose advantage is "
                                      "exactly 0 (no KL term): the same update, less compute")
    logits_budget_mb: float | None = Field(
        512, gt=0, description="cap on the float32 logits one forward of the update holds at once: larger "
        "vocabularies go through the LM head in chunks, recomputed in the backward (null = whole logits)")
    forward: Literal["auto", "packed", "hf"] = Field(
        "auto", description="the update's forward: packed (no padding, short rows share a row, the LM head only on "
        "completion tokens; Llama/Qwen2/Mistral), hf (the HF module on padded rows, any model), auto = packed when "
        "the model supports it")
    share_prompts: bool = Field(
        True, description="packed forward: rows of a micro-batch with identical prompt ids (a GRPO group) compute "
        "the prompt once and attend to it from each completion — the same log-probs and gradients, fewer tokens "
        "(update/prompt_tokens_shared); false lays out every row whole, for comparisons")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the update's matmuls: bfloat16 = autocast around its forwards and backward (fp32 master "
        "weights, optimizer state, log-softmax and loss), auto = bf16 where native (a CPU with AVX-512 BF16/AMX whose "
        "benchmark finds it faster, CUDA with bf16), else fp32; a policy loaded below fp32 (model.dtype) trains in "
        "its own dtype (docs/training.md#precision)")


class TrainConfig(StrictModel):
    """The run: its limits (steps, minutes, tokens), evals, checkpoints, logging, sync or async."""

    steps: int = Field(100, ge=0, description="RL steps")
    eval_every: int = Field(25, ge=0, description="evaluate every N steps (0 = only at start and end)")
    eval_size: int | None = Field(None, ge=1, description="cap on eval prompts (null = the task's whole eval split)")
    eval_samples: int = Field(4, ge=0, description="sampled completions per eval prompt for pass@k (0 = greedy only)")
    eval_cache: str | None = Field(
        None, description="a directory keeping the eval of the starting weights: a run with the same weights, eval "
        "prompts, judge, eval settings and machine reads it instead of computing it (a ledger's runs share one "
        "start; rollwise.eval.cache); null = always computed")
    checkpoint_every: int = Field(50, ge=0, description="checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="how many recent checkpoints to keep")
    log_samples: int = Field(4, ge=0, description="rollouts written to samples.jsonl per eval")
    log_rollouts: int = Field(2, ge=0, description="training groups written to rollouts.jsonl per step (every rollout's "
                              "text, rewards with reasons, advantage; 0 = none)")
    rollouts_mb: float = Field(20.0, gt=0, description="size bound of rollouts.jsonl: past it every other logged step "
                               "is dropped and steps are logged half as often")
    max_minutes: float | None = Field(None, gt=0, description="stop RL after this wall time (then eval and save)")
    max_generated_tokens: int | None = Field(
        None, ge=1, description="stop RL once the engine has sampled this many tokens, a controller's own policy "
        "forwards included (difficulty_select's embeddings): equal-compute comparisons")
    mode: Literal["sync", "async"] = Field(
        "sync", description="sync: generate, then update, in turn; async: a producer thread with its own copy of the "
        "weights generates ahead while the policy updates (train/pipeline.py)")
    max_staleness: int = Field(1, ge=0, description="async: batch s is sampled by policy version s - k, so a trained "
                               "token is at most k versions old (0 reproduces mode: sync)")
    generation_threads: int | None = Field(
        None, ge=1, description="async: torch threads of the generation side (null: half the cores, at least 1)")
    update_threads: int | None = Field(
        None, ge=1, description="async: torch threads of the update side (null: = generation_threads)")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="loggers beyond the run directory (TRL's name): tensorboard (event files in "
        "tensorboard/), wandb (offline under wandb/ unless WANDB_MODE is set); each is an extra: "
        "pip install 'rollwise[tensorboard]', 'rollwise[wandb]'")

    @field_validator("report_to", mode="before")
    @classmethod
    def _known_loggers(cls, value):
        return check_loggers(value)


class RewardConfig(StrictModel):
    name: str = Field(description="a reward known to `rollwise list rewards`, or 'package.module:function'")
    weight: float = Field(1.0, description="weight in the total reward")
    judge: JudgeConfig | None = Field(None, description="name: judge — the judge model and its rubric "
                                      "(rollwise.filter.judge; docs/tasks.md)")

    @model_validator(mode="after")
    def _judge_section(self):
        if (self.name == "judge") != (self.judge is not None):
            raise ValueError("a judge reward needs its section and only a judge reward has one: "
                             "{name: judge, judge: {rubric: ..., model: {path: ...}}} (or judge.base_url)")
        return self

    pow3r: Pow3rConfig | None = Field(None, description="name: pow3r — its rubric criteria, weights and categories "
                                      "(rollwise.filter.pow3r; unset: arith's answer and working)")

    @model_validator(mode="after")
    def _pow3r_section(self):
        if self.pow3r is not None and self.name != "pow3r":
            raise ValueError(f"rewards[].pow3r: only a pow3r reward has this section (name is {self.name!r})")
        return self

    weaver: WeaverConfig | None = Field(None, description="name: weaver — its weak verifiers and the fit "
                                        "(rollwise.filter.weaver; unset: arith's three checks)")

    @model_validator(mode="after")
    def _weaver_section(self):
        if self.weaver is not None and self.name != "weaver":
            raise ValueError(f"rewards[].weaver: only a weaver reward has this section (name is {self.name!r})")
        return self

    test_threshold: TestThresholdConfig | None = Field(
        None, description="name: test_threshold — code tests at a pass threshold, a judge for problems with few "
        "tests (rollwise.filter.soft_verify)")

    @model_validator(mode="after")
    def _test_threshold_section(self):
        if self.test_threshold is not None and self.name != "test_threshold":
            raise ValueError(f"rewards[].test_threshold: only a test_threshold reward has this section (name is "
                             f"{self.name!r})")
        return self

    majority_vote: MajorityVoteConfig | None = Field(
        None, description="name: majority_vote — the vote's thresholds (rollwise.filter.majority_vote; unset: "
        "label at a majority share >= .3, scale positive advantages above .9)")

    @model_validator(mode="after")
    def _majority_vote_section(self):
        if self.majority_vote is not None and self.name != "majority_vote":
            raise ValueError(f"rewards[].majority_vote: only a majority_vote reward has this section (name is "
                             f"{self.name!r})")
        return self


RUN_STATE_REWARDS = ("pow3r", "weaver")  # state across scoring calls that the checkpoint keeps (rewards.pt)


class RunConfig(StrictModel):
    name: str = Field("run", description="run directory name under output_dir")
    output_dir: str = Field("runs", description="where run directories go")
    seed: int = Field(0, description="fixes model init, data order and sampling")
    sampling_seed: int | None = Field(None, description="seed of training-rollout sampling alone (null = seed): "
                                      "another draw of the same run — same init, data order and eval set (the "
                                      "benches' noise-floor row)")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=ArithConfig)
    rewards: list[RewardConfig] | None = Field(None, description="reward functions; null = the task's own")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig,
                                   description="how model-written code runs (code tasks and code_* rewards)")
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    control: ControlConfig = Field(default_factory=ControlConfig,
                                   description="where the rollout budget goes (`rollwise list controllers`)")
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig,
                                 description="what is kept and trained on again (`rollwise list replay`)")

    @model_validator(mode="after")
    def _label_free_reward(self):
        check_labels(self.task, self.rewards)  # task.labels: none needs majority_vote (tasks/labels.py)
        return self

    @model_validator(mode="after")
    def _run_state_rewards_on_the_driver(self):
        stateful = [r.name for r in self.rewards or [] if r.name in RUN_STATE_REWARDS]
        if stateful and self.rollout.workers and self.rollout.score_on == "workers":
            raise ValueError(f"rewards: {', '.join(stateful)} carry state over the whole run (POW3R's smoothed "
                             "weights, Weaver's window); scored on rollout workers, each worker would keep its own "
                             "over its shard and the checkpoint none. Set rollout.score_on: driver")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_task_name(cls, data):
        # `--set task.max_digits=3` on the default task should not need `task.name=arith`
        if isinstance(data, dict) and isinstance(data.get("task"), dict) and "name" not in data["task"]:
            data = {**data, "task": {"name": "arith", **data["task"]}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _fill_across_sections(cls, data):
        # keys one section's setting fills in another where the recipe leaves them unset (FILLS)
        if isinstance(data, dict):
            for fill in FILLS:
                data = fill.apply(data)
        return data


def _fill_remix(data: dict) -> dict:
    if isinstance(data.get("replay"), dict) and data["replay"].get("method") == "remix":
        fill = remix_objective(ReplayConfig.model_validate(data["replay"]))
        objective = dict(data.get("objective") or {})
        data = {**data, "objective": {**fill, **{k: v for k, v in objective.items() if v is not None}}}
    return data


def _fill_token_correction(data: dict, source: Callable[[dict], str | None]) -> dict:
    """objective.tis_mode = token_truncate where ``source(data)`` names why sampled tokens are not the
    trained policy's, unless the recipe or the objective preset sets tis_mode."""
    objective = data.get("objective") or {}
    if not isinstance(objective, dict) or objective.get("tis_mode") is not None:
        return data
    if "tis_mode" in PRESETS.get(objective.get("method", "grpo"), {}) or source(data) is None:
        return data
    return {**data, "objective": {**objective, **STALE_TOKEN_OBJECTIVE}}


def _fill_stale_token_correction(data: dict) -> dict:
    return _fill_token_correction(data, off_policy_source)


def _fill_low_precision_correction(data: dict) -> dict:
    from rollwise.train.precision import lower_precision_source

    return _fill_token_correction(data, lower_precision_source)


def _fill_nudge(data: dict) -> dict:
    rollout, objective = data.get("rollout"), data.get("objective") or {}
    if not (isinstance(rollout, dict) and rollout.get("strategy") == "nudge" and isinstance(objective, dict)):
        return data
    return {**data, "objective": {**NUDGE_OBJECTIVE, **{k: v for k, v in objective.items() if v is not None}}}


def _fill_preset_sections(data: dict) -> dict:
    if isinstance(data.get("objective"), dict):
        for section, fill in PRESET_SECTIONS.get(data["objective"].get("method"), {}).items():
            current = data.get(section)
            if current is None or isinstance(current, dict):
                data = {**data, section: {**fill, **{k: v for k, v in (current or {}).items() if v is not None}}}
    return data


@dataclass(frozen=True)
class SectionFill:
    """Keys a setting fills in another section where the recipe leaves them unset: what the recipe
    sets always wins, and the run's ``config.yaml`` records the filled values."""

    when: str  # the setting, as a recipe writes it
    fills: str  # what it fills
    apply: Callable[[dict], dict]  # raw config dict -> raw config dict


# catalogue methods (shared METHODS.md ids) that are a setting of another component, not an entry of a registry
# `rollwise list` prints: the id, then the setting that turns it on and where it lives
SETTING_METHODS = {
    "treepo": "rollout.strategy=tree (TreePO segment trees, rollout.tree.*; generate/tree.py)",
    "tree_adv": "objective.tree_adv=true, the default with rollout.strategy=tree|latr (TreePO tree advantages, "
                "objective.tree_mix; optim/advantages.py)",
    "kl_estimators": "objective.kl_estimator=k1|k2|k3 with objective.beta > 0 (KL to the reference; optim/objective.py)",
    "tis_mis": "objective.tis_mode=token_truncate|token_mask|sequence_truncate|sequence_mask (rollout-trainer "
               "mismatch; filled for off-policy runs, see the fills in docs/config.md)",
    "staleness_async": "train.mode=async with train.max_staleness=k (AReaL bounded staleness; train/pipeline.py)",
    "token_faithful": "rollout.harness (the OpenAI-compatible endpoint records the sampled token ids and trains "
                      "them, never a re-tokenisation; serve/service.py)",
}

# every cross-section default, in the order they apply (each fill's values live with its component)
FILLS = (
    SectionFill("replay.method=remix", "objective.beta and objective.prox_kl_coef = replay.remix.beta / 2 "
                "(ReMix's KL-convex constraint; replay.remix_objective)", _fill_remix),
    SectionFill("a run that trains tokens sampled by older policies (train.mode=async with max_staleness >= 1, "
                "a replay method that serves stored groups, rollout.strategy=april, a guided strategy: guide, nudge, "
                "scope)",
                "objective.tis_mode = token_truncate, unless the objective preset sets tis_mode "
                "(optim.config.STALE_TOKEN_OBJECTIVE)", _fill_stale_token_correction),
    SectionFill("an engine that may sample below fp32 (rollout.engine_dtype=bfloat16; auto on CUDA or on a CPU with "
                "native bf16)", "objective.tis_mode = token_truncate, unless the objective preset sets tis_mode "
                "(train.precision)", _fill_low_precision_correction),
    SectionFill("rollout.strategy=brorl", "rollout.num_generations = 128, rollout.prompts_per_step = 2, "
                "rollout.max_batch_size = 128, optim.micro_batch_size = 16 (BroRL's large N; "
                "generate.brorl.BRORL_FILL)",
                fill_brorl),
    SectionFill("rollout.strategy=nudge", "objective.advantage = nudge, objective.scale_rewards = none (NudgeRL's "
                "inter/intra-context advantage; generate.nudge.NUDGE_OBJECTIVE)", _fill_nudge),
    SectionFill("objective.method=dapo or v05", "control.method = dynamic_sampling (DAPO is its loss and its dynamic "
                "sampling) or v05 (V0.5's prior test and extra rollouts); optim.config.PRESET_SECTIONS",
                _fill_preset_sections),
)


def off_policy_source(data: dict) -> str | None:
    """What makes a run train on tokens sampled by older policies (the first of async with
    ``max_staleness >= 1``, a replay method that serves stored groups, APRIL's carried rollouts),
    named as config settings, or None. ``data`` holds the raw ``train``/``replay``/``rollout``
    sections (dicts or config objects; a malformed one counts as absent: validation reports it)."""
    sections = {}
    for name, model in (("train", TrainConfig), ("replay", ReplayConfig), ("rollout", RolloutConfig)):
        raw = data.get(name)
        if isinstance(raw, model):
            sections[name] = raw
            continue
        try:
            sections[name] = model.model_validate(raw if isinstance(raw, dict) else {})
        except ValidationError:
            sections[name] = model()
    train, replay, rollout = sections["train"], sections["replay"], sections["rollout"]
    if train.mode == "async" and train.max_staleness >= 1:
        return f"train.mode=async with max_staleness={train.max_staleness}"
    if replay_serves_stored_groups(replay):
        return f"replay.method={replay.method}"
    if rollout.strategy == "april":
        return "rollout.strategy=april"
    if rollout.strategy in GUIDED:  # sampled under a context the trained prompt lacks
        return f"rollout.strategy={rollout.strategy}"
    return None


def load_run_config(path: str | None, overrides: list[str] = ()) -> RunConfig:
    """The recipe at ``path`` (None: the defaults) with ``--set`` overrides. The recipe's directory
    becomes the second place relative module specs and data paths are looked up (``rollwise.imports``)."""
    from rollwise.imports import set_recipe_dir

    set_recipe_dir(Path(path).parent if path else None)
    data = load_yaml(path) if path else {}
    cfg = validate(RunConfig, apply_overrides(data, list(overrides)))
    check_sft_demos(cfg)
    return cfg


def check_sft_demos(cfg: RunConfig) -> None:
    """An SFT warm start on a file task without ``task.demo_field`` is refused here, before a run
    directory exists (other tasks without demonstrations are refused by ``train.sft`` itself)."""
    from rollwise.train.sft import no_demonstrations

    if cfg.sft.steps and cfg.task.name == "file" and cfg.task.demo_field is None:
        raise ConfigError(no_demonstrations("file"))
