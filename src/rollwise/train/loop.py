"""The synchronous trainer: Control → Generate → Filter → Control → Optimize, one step at a time.

``Trainer.step`` is the loop of DESIGN.md and reads top to bottom; everything it calls
lives in a stage package. ``Trainer.fit(until=...)`` is the one outer loop around it (eval
and checkpoint cadence, stop on steps, minutes or generated tokens): the CLI, the benchmarks
and the tests all call it. The trainer owns the run directory, checkpoints and evaluation.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from rollwise.config import ConfigError
from rollwise.control import PromptCursor, PromptStats, build_controller
from rollwise.control.rounds import accept_and_refill, extend_rounds
from rollwise.engine import make_engine
from rollwise.engine.sampling import SamplingParams
from rollwise.eval.accuracy import EvalResult, evaluate
from rollwise.filter.overlong import add_overlong_penalty
from rollwise.filter.registry import resolve_rewards
from rollwise.filter.rewards import score_groups
from rollwise.filter.sandbox import Sandbox
from rollwise.generate import build_generator
from rollwise.model import lora
from rollwise.model.load import encode_prompt, load_model_and_tokenizer, model_dir
from rollwise.model.packed import supports_packing
from rollwise.optim.batch import build_batch
from rollwise.optim.objective import assign_advantages
from rollwise.optim.update import policy_update
from rollwise.replay import build_replay
from rollwise.replay import check_composition as check_replay
from rollwise.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_control_state,
    load_generator_state,
    load_pipeline_state,
    load_reference,
    load_replay_state,
    save_checkpoint,
)
from rollwise.train.config import RunConfig
from rollwise.train.metrics import Clock, MetricsLog, rollout_metrics, staleness_metrics, tree_record
from rollwise.train.pipeline import Pipeline
from rollwise.train.sft import sft
from rollwise.types import Prompt, RolloutGroup


@dataclass
class TrainState:
    """What a checkpoint records besides tensors (``state.json``)."""

    step: int = 0
    cursor: int = 0  # index of the next training prompt
    generated_tokens: int = 0
    wall_seconds: float = 0.0  # RL wall time, summed over sessions of a resumed run
    initial_accuracy: float | None = None
    last_accuracy: float | None = None
    reference_moved_at: int | None = None  # the step the reference model became the policy (ReMix), if any


def lr_lambda(cfg: RunConfig):
    o, total = cfg.optim, max(cfg.train.steps, 1)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(total - o.warmup_steps, 1))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if o.schedule == "cosine" else 1 - progress
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * shape

    return factor


@dataclass(frozen=True)
class Until:
    """When ``Trainer.fit`` stops: the first limit reached (None = no limit of that kind)."""

    steps: int | None = None
    minutes: float | None = None  # RL wall time, summed over the sessions of a resumed run
    generated_tokens: int | None = None  # tokens the engine sampled (equal-compute comparisons)

    @classmethod
    def from_config(cls, train) -> "Until":
        return cls(steps=train.steps, minutes=train.max_minutes, generated_tokens=train.max_generated_tokens)

    def reached(self, state: "TrainState") -> str | None:
        """The name of the limit ``state`` has reached, or None."""
        if self.steps is not None and state.step >= self.steps:
            return f"steps={self.steps}"
        if self.minutes is not None and state.wall_seconds > 60 * self.minutes:
            return f"max_minutes={self.minutes}"
        if self.generated_tokens is not None and state.generated_tokens >= self.generated_tokens:
            return f"max_generated_tokens={self.generated_tokens:,}"
        return None

    def progress(self, state: "TrainState") -> float:
        """How far ``state`` is towards stopping: the largest used/limit over the limits set (0 if none)."""
        used = [state.step / self.steps if self.steps else 0.0,
                state.wall_seconds / (60 * self.minutes) if self.minutes else 0.0,
                state.generated_tokens / self.generated_tokens if self.generated_tokens else 0.0]
        return max(used)


def packed_forward(choice: str, model) -> bool:
    """Whether the update runs the packed forward (``optim.forward``)."""
    if choice == "hf":
        return False
    if supports_packing(model):
        return True
    if choice == "packed":
        raise ConfigError(f"optim.forward=packed runs Llama/Qwen2/Mistral models, not model_type "
                          f"{model.config.model_type!r}; set optim.forward=auto or hf")
    return False


def async_threads(cfg: RunConfig) -> int:
    """The torch thread count of ``train.mode=async`` (both sides: torch's count is process-wide)."""
    t = cfg.train
    gen = t.generation_threads or max(1, (os.cpu_count() or 2) // 2)
    upd = t.update_threads or gen
    if gen != upd:
        raise ConfigError(f"train.generation_threads={gen} and train.update_threads={upd} differ: in one process "
                          "torch's intra-op thread count is process-wide, so both sides run with one count; set them "
                          "equal (on N cores, N/2 each)")
    if t.max_staleness > 0 and cfg.objective.tis_mode == "none":
        raise ConfigError(f"train.mode=async with max_staleness={t.max_staleness} trains on tokens sampled by older "
                          "policies, but objective.tis_mode=none does not correct for it; set objective.tis_mode "
                          "(e.g. token_truncate: objective.method=decoupled_ppo) or train.max_staleness=0")
    if cfg.rollout.strategy == "april":
        raise ConfigError("rollout.strategy=april with train.mode=async: APRIL carries partial rollouts into later "
                          "steps, past the staleness bound; async already overlaps generation with the update — use "
                          "rollout.strategy=group, tree or latr, or train.mode=sync")
    return gen


def sampling_params(rollout, tokenizer) -> SamplingParams:
    """Training rollouts' sampling settings (``rollout.*``), stopping at the tokenizer's EOS."""
    return SamplingParams(rollout.temperature, rollout.top_p, rollout.top_k, rollout.max_new_tokens,
                          (tokenizer.eos_token_id,))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        seed_everything(cfg.seed)
        threads = async_threads(cfg) if cfg.train.mode == "async" else cfg.model.threads
        if threads:
            torch.set_num_threads(threads)
        self.run_dir = Path(cfg.output_dir) / cfg.name
        self.sandbox = Sandbox(cfg.sandbox)  # the run's own: code tasks and rewards get it, close() stops it
        self.task = cfg.task.build(cfg.seed, self.sandbox)
        lora.check_composition(cfg)
        self.model, self.tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.seed)
        self.reward_fns, self.judge = resolve_rewards(cfg.rewards, self.task, self.sandbox)
        self.optimizer = torch.optim.AdamW(  # model.lora: the adapters only
            lora.trainable_parameters(self.model), lr=cfg.optim.lr, betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.packed = packed_forward(cfg.optim.forward, self.model)
        self.engine = make_engine(self.model, pad_token_id=self.tokenizer.pad_token_id,
                                  max_batch_size=cfg.rollout.max_batch_size, seed=cfg.seed, kind=cfg.rollout.engine)
        r = cfg.rollout
        self.stop_ids = (self.tokenizer.eos_token_id,)
        self.sampling = sampling_params(r, self.tokenizer)
        self.stats = PromptStats()  # per-prompt running statistics the controller reads
        self.set_controller(build_controller(cfg.control, r, cfg.seed, embed=self.embed_prompts))
        check_replay(cfg.replay, r, cfg.objective)
        # no fixed step count: step() reports the run's progress towards whichever limit stops it
        self.replay = build_replay(cfg.replay, seed=cfg.seed, prompts_per_step=r.prompts_per_step, total_steps=0)
        self.until = Until.from_config(cfg.train)  # the limits fit() runs to (fit(until=...) replaces them)
        self.eval_prompts = [self.tokenize(p) for p in self.task.eval[: cfg.train.eval_size]]
        self.pool = None  # rollout.workers > 0: Ray rollout workers (dist/) generate in place of the engine
        if r.workers:
            from rollwise.dist import WorkerPool

            self.pool = WorkerPool(cfg, self.model)
        self.state = TrainState()
        self.pipeline: Pipeline | None = None  # train.mode=async: the producer thread (started by step())
        self.queued: list[Collected] = []  # async: batches a resumed checkpoint holds, generated but untrained
        self.ref_model = None
        self.log: MetricsLog | None = None
        self.stopped_by: str | None = None  # the limit that ended the last fit()
        self.last_tree: RolloutGroup | None = None  # the last step's first tree group, for trees.jsonl at the next eval

    def set_controller(self, controller) -> None:
        """Use ``controller`` (built from ``control.*``, or your own ``Controller`` subclass) and build
        the generator around it: a pruning controller (arrol) samples through its pruner, one that
        overrides ``should_continue`` is asked at every ``continue_every`` tokens of a rollout."""
        self.controller = controller
        if self.cfg.rollout.workers and (controller.prunes or controller.gates):
            raise ConfigError(f"control.method={self.cfg.control.method} stops rollouts inside generation, on the "
                              "driver's controller; rollout workers generate apart from it — set rollout.workers=0 "
                              "or choose a controller that selects or allocates (`rollwise list controllers`)")
        if self.cfg.rollout.workers and self.cfg.rollout.strategy == "april":
            raise ConfigError("rollout.strategy=april carries partial rollouts from step to step inside one engine; "
                              "with rollout.workers use rollout.strategy=group, tree or latr (or rollout.workers=0)")
        pruner = controller if controller.prunes else None  # arrol prunes inside generation
        gate = (lambda partial: controller.should_continue(partial, self.stats)) if controller.gates else None
        self.generator = build_generator(self.cfg.rollout, self.sampling, self.decode, pruner=pruner, gate=gate,
                                         gate_every=controller.continue_every)

    # -- helpers the loop calls -------------------------------------------------------------
    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tokenize(self, prompt: Prompt) -> Prompt:
        if not prompt.token_ids:
            prompt.token_ids = encode_prompt(self.tokenizer, prompt)
        return prompt

    def prompt_source(self) -> PromptCursor:
        """The train stream at the data cursor, handing out tokenized prompts (the step writes the cursor back)."""
        return PromptCursor(self.task.train, self.state.cursor, self.tokenize)

    def select_prompts(self) -> list[Prompt]:
        """This step's prompts, as the controller selects them (advances the data cursor)."""
        source = self.prompt_source()
        prompts = self.controller.select_prompts(source, self.stats, self.prompts_wanted())
        self.state.cursor = source.cursor
        return prompts

    def prompts_wanted(self) -> int:
        return self.generator.prompts_wanted(self.cfg.rollout.prompts_per_step)

    def embed_prompts(self, prompts: list[Prompt]):
        """[N, d] normalised prompt embeddings under the policy (difficulty_select's similarity)."""
        from rollwise.control.difficulty import prompt_embeddings

        model = self.pipeline.model if self.pipeline is not None else self.model  # async: the producer's copy
        return prompt_embeddings(model, prompts, self.tokenizer.pad_token_id)

    def generate_and_score(self, prompts: list[Prompt], budgets: list[int], clock: "Clock", salt: int = 0, *,
                           step: int | None = None, engine=None) -> tuple[list[RolloutGroup], dict[str, float], int]:
        """One round for training step ``step`` (default: the current one) on ``engine`` (default: the
        trainer's): generate ``budgets[i]`` rollouts of ``prompts[i]`` (prompts with 0 skipped), score
        them, record them in ``PromptStats``; returns (groups, metrics, tokens the engine sampled)."""
        cfg = self.cfg
        step = self.state.step if step is None else step
        engine = engine or self.engine
        before = engine.stats.decode_tokens
        kept = [(p, b) for p, b in zip(prompts, budgets) if b > 0]
        prompts, budgets = [p for p, _ in kept], [b for _, b in kept]
        # an extra round samples with its own seed, fixed by (step seed, round)
        seed = self.step_seed(step) if salt == 0 else hash((self.step_seed(step), salt)) & (2**62 - 1)
        remote = getattr(engine, "remote", False)  # dist.WorkerPool: workers run the strategy (and score)
        if remote:
            groups, metrics = engine.generate(prompts, budgets, seed=seed)
        else:
            groups, metrics = self.generator.generate(engine, prompts, budgets, seed=seed)
        sampled = engine.stats.decode_tokens - before  # every token the engine sampled, once
        clock.lap("generate")
        if not (remote and engine.scores):
            metrics |= score_groups(groups, self.reward_fns)
        if cfg.objective.overlong_shaping:
            metrics |= add_overlong_penalty(groups, cfg.rollout.max_new_tokens)
        for g in groups:
            self.stats.observe(g, step)
        clock.lap("score")
        return groups, metrics, sampled

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One step. Sync: collect this step's groups with the current policy, then train on them.
        Async: train on the batch the producer made ahead (starting it on the first call), then
        publish the new weights to it."""
        self.replay.progress(self.state.step, self.until.progress(self.state))  # ReMix's reincarnation point
        if self.cfg.train.mode == "async":
            if self.pipeline is None:
                self.pipeline = Pipeline(self, self.cfg.train.max_staleness, self.queued)
                self.queued = []
                self.pipeline.start()
            self.publish()
            batch, waited = self.pipeline.take(self.state.step)
            metrics = self.train_on(batch, waited)
            return metrics | self.pipeline.metrics(self.state.step)
        batch = self.collect(self.state.step, self.state.cursor, self.pool or self.engine)
        self.state.cursor = batch.cursor
        return self.train_on(batch)

    def collect(self, step: int, cursor: int, engine) -> "Collected":
        """Generate → Filter → Control for training step ``step``, reading the train stream from
        ``cursor``, sampling on ``engine``: select, allocate, generate and score, extra rounds,
        accept and refill. Touches the controller, ``PromptStats`` and the generator, never the
        policy being trained (async mode runs this on the producer thread)."""
        cfg, clock, control, stats = self.cfg, Clock(), self.controller, self.stats
        control.step, source = step, PromptCursor(self.task.train, cursor, self.tokenize)
        wanted = self.prompts_wanted()
        if cfg.train.mode == "sync":  # replay serves part of the batch: fewer fresh prompts (async: on top)
            wanted = self.replay.fresh_prompts(wanted, step)
        prompts = control.select_prompts(source, stats, wanted)
        budget = cfg.rollout.num_generations * len(prompts)
        budgets = control.allocate(prompts, stats, budget)
        reuse = self.keep_prompt_prefixes(len(prompts), engine)
        groups, metrics, sampled = self.generate_and_score(prompts, budgets, clock, step=step, engine=engine)
        tokens = [sampled]

        def another_round(prompts, budgets, salt):  # extra rounds: extend (xrpo, dars), refill (dynamic sampling)
            more, _, sampled = self.generate_and_score(prompts, budgets, clock, salt, step=step, engine=engine)
            tokens.append(sampled)
            return more, sampled

        metrics |= extend_rounds(control, stats, groups, another_round, budget - sum(budgets))
        groups, refill = accept_and_refill(control, stats, source, groups, another_round, len(prompts),
                                           cfg.rollout.num_generations)
        if reuse is not None:
            engine.keep_prefixes(0)
            metrics["control/prefix_reused_tokens"] = float(engine.stats.prefix_cache_tokens - reuse)
        control.observe_step(groups, stats)
        metrics |= refill | control.metrics() | clock.metrics()
        tokens.append(control.forward_tokens())  # a selector's own policy forwards count toward the token budget
        return Collected(step, groups, metrics, sum(tokens), source.cursor)

    def train_on(self, batch: "Collected", waited: float = 0.0) -> dict[str, float]:
        """Optimize on a collected batch: advantages, the policy update, the new weights to the engine."""
        cfg, start = self.cfg, time.perf_counter()
        step, metrics = self.state.step, dict(batch.metrics)
        metrics |= assign_advantages(batch.groups, cfg.objective)  # within the groups as sampled
        self.last_tree = next((g for g in batch.groups if g.tree is not None), None)
        # replay: the groups to train (fresh and kept ones, with their own log-probs, versions, advantages)
        groups, replayed = self.replay.compose(batch.groups, step=step, version=step)
        metrics |= replayed
        if self.replay.reincarnate(step) and self.ref_model is not None:  # ReMix: the reference moves to π_θ
            self.ref_model.load_state_dict(self.model.state_dict())
            self.state.reference_moved_at = step
        tensors = build_batch(groups, self.tokenizer.pad_token_id, cfg.objective.mask_truncated_completions)
        o, r = cfg.optim, cfg.rollout
        passes = max(o.num_iterations, self.controller.update_passes, self.replay.update_passes(step))
        metrics |= policy_update(
            self.model, self.optimizer, tensors, cfg.objective, micro_batch_size=o.micro_batch_size,
            num_iterations=passes, max_grad_norm=o.max_grad_norm,
            max_len=r.max_new_tokens, temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
            ref_model=self.ref_model, skip_zero_advantage=o.skip_zero_advantage, logits_budget_mb=o.logits_budget_mb,
            packed=self.packed, share_prompts=o.share_prompts,
        )
        metrics["lr"] = self.scheduler.get_last_lr()[0]  # the LR this step trained with
        self.scheduler.step()  # once per training step, however many iterations the update ran
        self.engine.load_weights(self.model)  # in-process: parameters are shared, only the version moves
        if self.pool is not None and self.pipeline is None:  # sync with workers: they load at next use
            self.pool.load_weights(self.model)
        update = time.perf_counter() - start
        self.state.step += 1
        self.state.generated_tokens += batch.tokens
        metrics |= staleness_metrics(groups, self.state.step - 1)
        if self.pipeline is not None:  # async: the batch was sampled concurrently; the step is the wait + the update
            metrics |= {"time/update": update, "time/wait": waited, "time/step": update + waited}
        else:
            metrics |= {"time/update": update, "time/step": metrics.get("time/step", 0.0) + update}
        return metrics | rollout_metrics(groups) | {
            "tokens/generated": float(batch.tokens), "tokens/total": self.state.generated_tokens}

    def publish(self) -> None:
        """Async: hand the weights of the current step to the producer (``fit`` does it after the
        step's eval and checkpoint, so a checkpoint at step s always holds batches s … s+k−1)."""
        if self.pipeline is not None:
            self.pipeline.publish(self.state.step)

    def keep_prompt_prefixes(self, n: int, engine) -> int | None:
        """For a controller that extends (XRPO, DARS): ``engine`` keeps this step's ``n`` prompt
        prefixes, so an extra round for a prompt copies its cached prefix instead of prefilling
        it again (until the step's end). Returns the engine's reused-token count so far, or None."""
        if not self.controller.extends or not hasattr(engine, "keep_prefixes"):
            return None
        engine.keep_prefixes(n)
        return engine.stats.prefix_cache_tokens

    def step_seed(self, step: int | None = None) -> int:
        seed = self.cfg.seed if self.cfg.sampling_seed is None else self.cfg.sampling_seed
        return seed * 1_000_003 + (self.state.step if step is None else step)

    # -- around the step --------------------------------------------------------------------
    def evaluate(self) -> EvalResult:
        tc = self.cfg.train
        return evaluate(
            self.engine, self.eval_prompts, self.judge, self.decode, max_new_tokens=self.cfg.rollout.max_new_tokens,
            stop_token_ids=self.stop_ids, samples=tc.eval_samples, temperature=self.cfg.rollout.temperature,
            seed=self.cfg.seed, keep=tc.log_samples,
        )

    def prepare(self, resume: bool = False, on_sft_step=None) -> None:
        """Fresh run: write config, run the SFT warm start, save the RL start. Resume: load the latest checkpoint."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if resume and ckpt is None:
            raise ConfigError(f"--resume: no checkpoint in {self.run_dir / 'checkpoints'} (drop --resume to start the run)")
        if ckpt is not None:
            self.state = TrainState(**load_checkpoint(ckpt, self.model, self.optimizer, self.scheduler))
            self.engine.load_weights(self.model)
            self.engine.version = self.state.step  # a token's version = optimizer steps before it was sampled
            if self.pool is not None:
                self.pool.load_weights(self.model)
                self.pool.version = self.state.step
                self.pool.load_generator_state(load_generator_state(ckpt) or {})
            else:
                self.generator.load_state_dict(load_generator_state(ckpt) or {})
            control = load_control_state(ckpt) or {}
            self.controller.load_state_dict(control.get("controller", {}))
            self.stats.load_state_dict(control.get("stats", {}))
            self.queued = load_pipeline_state(ckpt)
            self.replay.load_state_dict(load_replay_state(ckpt))
        else:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
            # a fresh run in an existing directory starts over: nothing stale may be resumed later
            for stale in ("metrics.jsonl", "samples.jsonl", "trees.jsonl", "evals.jsonl", "summary.json",
                          "report.html"):
                (self.run_dir / stale).unlink(missing_ok=True)
            for stale in ("checkpoints", "init_model"):
                shutil.rmtree(self.run_dir / stale, ignore_errors=True)
            (self.run_dir / "init_model.json").unlink(missing_ok=True)
            if self.cfg.sft.steps:
                s = self.cfg.sft
                sft(self.model, self.tokenizer, self.task, steps=s.steps, batch_size=s.batch_size, lr=s.lr,
                    on_step=on_sft_step)
            self.save_init_model()
        if self.cfg.objective.needs_reference and self.cfg.model.lora is not None:  # the base, adapters off
            self.ref_model = lora.AdapterDisabled(self.model)
        elif self.cfg.objective.needs_reference:  # the frozen reference is the RL starting point
            self.ref_model = type(self.model).from_pretrained(self.init_model_dir(), dtype=self.model.dtype)
            self.ref_model.to(self.engine.device).eval()
            if ckpt is not None and self.state.reference_moved_at is not None:
                load_reference(ckpt, self.ref_model)
        self.log = MetricsLog(self.run_dir, resume_from_step=self.state.step if ckpt else None,
                              report_to=self.cfg.train.report_to, config=self.cfg.model_dump(mode="json"))

    def save_init_model(self) -> None:
        """Keep the RL starting point: a copy in ``init_model/`` when the run made it (SFT warm
        start, a built preset), else only the source directory's path in ``init_model.json`` —
        copying an unchanged 7B model would write 28 GB for nothing."""
        if self.cfg.sft.steps or self.cfg.model.path is None:
            lora.save_base(self.model, self.run_dir / "init_model")  # model.lora: the base alone
            self.tokenizer.save_pretrained(self.run_dir / "init_model")
        else:
            source = str(model_dir(self.cfg.model).resolve())  # a .gguf or pkg: path: its HF directory
            (self.run_dir / "init_model.json").write_text(json.dumps({"path": source}, indent=2))

    def init_model_dir(self) -> Path:
        """The directory holding the RL starting weights (``init_model/`` or the recorded source)."""
        record = self.run_dir / "init_model.json"
        return Path(json.loads(record.read_text())["path"]) if record.exists() else self.run_dir / "init_model"

    def record_eval(self) -> EvalResult:
        result = self.evaluate()
        if self.state.initial_accuracy is None:
            self.state.initial_accuracy = result.accuracy
        self.state.last_accuracy = result.accuracy
        self.log.log(self.state.step, result.metrics())
        self.log.log_samples(self.state.step, result.samples)
        self.log.log_eval(self.state.step, result.prompt_ids, result.correct)
        if self.last_tree is not None:  # tree strategies: one training group's tree per eval
            self.log.log_tree(self.state.step, tree_record(self.last_tree, self.decode))
            self.last_tree = None
        return result

    def write_report(self) -> Path | None:
        """Write ``report.html`` into the run directory (``rollwise.report``); the run's files are
        what it reads. A report that fails logs a warning and returns None: it never fails a run."""
        try:
            from rollwise.report import write_report

            return write_report([self.run_dir])
        except Exception as err:  # noqa: BLE001 — the report is a view of the run, never a reason to lose it
            logging.getLogger("rollwise").warning("run report not written: %s: %s", type(err).__name__, err)
            return None

    def checkpoint(self) -> Path:
        """Save everything a resumed run needs, atomically. Async: first hold the producer at a batch
        boundary with every batch that needs an older policy version made; those generated but not
        yet trained batches are saved too (``pipeline.pt``), with the producer's data cursor."""
        queued = None
        if self.pipeline is not None:
            queued, self.state.cursor = self.pipeline.barrier(self.state.step)
        try:
            control = None
            if self.cfg.control.method != "none":  # the run without control keeps its checkpoint layout
                control = {"controller": self.controller.state_dict(), "stats": self.stats.state_dict()}
            return save_checkpoint(self.run_dir, self.state.step, self.model, self.optimizer, self.scheduler,
                                   asdict(self.state), self.cfg.train.keep_checkpoints,
                                   self.generator_state() or None, control, queued,
                                   self.replay.state_dict() if self.cfg.replay.method != "none" else None,
                                   self.ref_model if self.state.reference_moved_at is not None else None)
        finally:
            if self.pipeline is not None:
                self.pipeline.release()

    def generator_state(self) -> dict:
        """The rollout strategy's state: the trainer's generator's, or each rollout worker's."""
        return self.pool.generator_state() if self.pool is not None else self.generator.state_dict()

    def fit(self, until: Until | None = None, on_step: Callable[[int, dict], None] | None = None,
            on_eval: Callable[[int, EvalResult], None] | None = None) -> dict:
        """The outer loop: step until ``until`` (default: the recipe's ``train`` limits), evaluating
        every ``train.eval_every`` steps, at the start and at the end, checkpointing every
        ``train.checkpoint_every`` steps and at the end; writes ``summary.json`` and returns it.

        Call ``prepare()`` first. ``on_step(step, metrics)`` and ``on_eval(step, result)`` let a
        caller show progress; the loop itself never prints.
        """
        tc, until = self.cfg.train, until or Until.from_config(self.cfg.train)
        self.until = until
        if self.log is None:
            raise RuntimeError("Trainer.fit: call prepare() first")
        if self.state.step == 0 and self.state.initial_accuracy is None:
            result = self.record_eval()
            if on_eval:
                on_eval(0, result)
        session_start, base_wall = time.perf_counter(), self.state.wall_seconds
        self.stopped_by = until.reached(self.state)
        while self.stopped_by is None:
            metrics = self.step()
            self.state.wall_seconds = base_wall + time.perf_counter() - session_start
            step = self.state.step
            self.log.log(step, metrics)
            self.stopped_by = until.reached(self.state)
            if on_step:
                on_step(step, metrics)
            last = self.stopped_by is not None
            if (tc.eval_every and step % tc.eval_every == 0) or last:
                result = self.record_eval()
                if on_eval:
                    on_eval(step, result)
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or last:
                self.checkpoint()
            if not last:
                self.publish()
        self.stop_pipeline()
        summary = self.summary()
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def stop_pipeline(self) -> None:
        """Async: let the producer finish the batches the next step may need, stop it at a batch
        boundary and keep what it queued (a later ``step()`` starts a new producer from there)."""
        if self.pipeline is None:
            return
        try:
            self.queued, self.state.cursor = self.pipeline.barrier(self.state.step)
        finally:
            self.pipeline.stop()
            self.pipeline = None

    def close(self) -> None:
        """Flush the logs and stop what the run started (the async producer, the sandbox's workers)."""
        if self.pipeline is not None:  # stopped without waiting for more batches
            self.pipeline.stop()
            self.pipeline = None
        if self.log is not None:
            self.log.close()
        if self.pool is not None:  # the rollout workers' actors
            self.pool.close()
            self.pool = None
        self.sandbox.close()

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def summary(self) -> dict:
        s = self.state
        return {
            "initial_accuracy": s.initial_accuracy, "final_accuracy": s.last_accuracy, "steps": s.step,
            "wall_seconds": round(s.wall_seconds, 2), "generated_tokens": s.generated_tokens, "seed": self.cfg.seed,
            "task": self.task.name, "method": self.cfg.objective.method,
        } | ({"control": self.cfg.control.method} if self.cfg.control.method != "none" else {}) | (
            {"replay": self.cfg.replay.method} if self.cfg.replay.method != "none" else {}) | (
            {"mode": "async", "max_staleness": self.cfg.train.max_staleness} if self.cfg.train.mode == "async" else {})


@dataclass
class Collected:
    """A training step's groups, scored, as Collect hands them to Optimize (async: through the queue)."""

    step: int  # the training step they are for
    groups: list[RolloutGroup]
    metrics: dict[str, float]  # the collection's own (strategy, filter, control, time/generate, time/score)
    tokens: int  # tokens the engine sampled for them
    cursor: int  # the train stream's data cursor after them
