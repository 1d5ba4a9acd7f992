"""The trainer: Control → Generate → Filter → Control → Replay → Optimize, one step at a time.

A step is three methods, read top to bottom:

- ``step``: sync — ``collect`` this step's groups with the current policy, then ``train_on``
  them; async — ``train_on`` the batch the producer (``train/pipeline.py``) collected ahead;
- ``collect``: select prompts, allocate rollouts, sample and score the first round
  (``train/collect.py``'s ``RoundSampler``), the controller's extra rounds
  (``control/rounds.py``: extend, accept + refill) → a ``ScoredBatch``;
- ``train_on``: advantages, replay's batch, the policy update (``optim/update.py``), the new
  weights to the engine.

``Trainer.fit(until=...)`` is the one outer loop around it (eval and checkpoint cadence, stop
on steps, minutes or generated tokens): the CLI, the benchmarks and the tests all call it.
The run directory's files live in ``train/rundir.py``, checkpoints in ``train/checkpoint.py``,
what is built from the config in ``train/build.py``, and every seed in ``rollwise.seeds``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rollwise import seeds
from rollwise.control import PromptCursor, PromptStats, build_controller
from rollwise.control.difficulty import PolicyEmbedder, StartEmbedder
from rollwise.control.masa import MetaReadout
from rollwise.control.rounds import PromptPrefixes, accept_and_refill, extend_rounds
from rollwise.engine import make_engine
from rollwise.eval.accuracy import EvalResult, evaluate
from rollwise.eval.support import track
from rollwise.filter.registry import resolve_rewards
from rollwise.tasks.rewrites import build_rewriter
from rollwise.optim.old_logits import record_old_logprobs
from rollwise.optim.vcpo import assign_vcpo, policy_log_ratios, scaled_lr
from rollwise.filter.sandbox import Sandbox
from rollwise.generate import build_generator, check_guidance, sampling_params
from rollwise.model import lora
from rollwise.model.load import encode_prompt, load_model_and_tokenizer
from rollwise.model.reference import as_reference
from rollwise.optim.batch import build_batch
from rollwise.optim.entropy_steps import keep_high_entropy_steps
from rollwise.optim.objective import assign_advantages
from rollwise.optim.poise import build_value_baseline
from rollwise.optim.update import UpdateSpec, compute, policy_update
from rollwise.replay import build_replay
from rollwise.replay import check_composition as check_replay
from rollwise.tasks.labels import with_labels
from rollwise.train import outcome, precision, rundir
from rollwise.train import resume as resume_rules
from rollwise.train.build import (
    async_threads,
    check_workers,
    embedding_model,
    episode_sampler,
    harness_sampler,
    lr_lambda,
    packed_forward,
    reference_model,
    seed_everything,
    update_optimizer,
)
from rollwise.train.checkpoint import load_reference, restore_run, save_run
from rollwise.train.collect import RoundSampler, ScoredBatch
from rollwise.train.config import RunConfig
from rollwise.train.metrics import Clock, MetricsLog, rollout_metrics, staleness_metrics, tree_record
from rollwise.train.pipeline import Pipeline
from rollwise.train.rollout_log import RolloutLog
from rollwise.train.sft import warm_start
from rollwise.train.state import RunLimits, TrainState, run_summary
from rollwise.types import Prompt, RolloutGroup

Collected = ScoredBatch  # the old name: pipeline.pt files written before the rename unpickle through it


class Trainer:
    def __init__(self, cfg: RunConfig):
        self._cpu_mark = time.process_time()  # TrainState.cpu_seconds counts this session from here (count_cpu)
        self.cfg, r = cfg, cfg.rollout
        seed_everything(cfg.seed)
        threads = async_threads(cfg) if cfg.train.mode == "async" else cfg.model.threads
        if threads:
            torch.set_num_threads(threads)
        self.run_dir = Path(cfg.output_dir) / cfg.name
        self.sandbox = Sandbox(cfg.sandbox)  # the run's own: code tasks and rewards get it, close() stops it
        self.task = with_labels(cfg.task.build(cfg.seed, self.sandbox), cfg.task)  # task.labels: none hides answers
        lora.check_composition(cfg)
        self.model, self.tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.seed)
        self.reward_fns, self.judge = resolve_rewards(cfg.rewards, self.task, self.sandbox)
        outcome.start_notes(self.task, self.tokenizer, self.judge, cfg.rewards is not None)  # judge, chat template
        self.optimizer = torch.optim.AdamW(  # model.lora: the adapters only
            lora.trainable_parameters(self.model), lr=cfg.optim.lr, betas=cfg.optim.betas,
            weight_decay=cfg.optim.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.packed = packed_forward(cfg.optim.forward, self.model)
        # the engine samples from its own copy in this precision; the guard watches the mismatch (train/precision.py)
        self.engine_dtype, self.engine_dtype_reason = precision.choose(r.engine_dtype, self.model)
        self.guard = precision.MismatchGuard(r.engine_dtype, self.engine_dtype, r.mismatch_kl_bound)
        self.compute_dtype, self.compute_dtype_reason = precision.choose_update(cfg.optim.compute_dtype, self.model)
        precision.start_note((self.engine_dtype, self.engine_dtype_reason),
                             (self.compute_dtype, self.compute_dtype_reason))
        self.engine = make_engine(self.model, pad_token_id=self.tokenizer.pad_token_id,
                                  max_batch_size=r.max_batch_size, seed=cfg.seed, kind=r.engine,
                                  dtype=self.engine_dtype)
        self.stop_ids = (self.tokenizer.eos_token_id,)
        self.sampling = sampling_params(r, self.tokenizer)
        self.stats = PromptStats()  # per-prompt running statistics the controller reads
        self.embed_model = None  # difficulty_select's fixed embedding model, the starting weights (prepare())
        embed = (StartEmbedder(lambda: as_reference(self.embed_model).module(), self.tokenizer)  # difficulty_select's
                 if cfg.control.difficulty_select.embeddings == "start"
                 else PolicyEmbedder(self.sampling_policy, self.tokenizer.pad_token_id))
        meta = MetaReadout(self.sampling_policy, self.tokenizer, cfg.control.masa.length_unit)  # masa's p̂, L̂
        self.meta_align = MetaReadout(None, self.tokenizer, cfg.control.masa.length_unit)  # and their training
        rewrite = build_rewriter(cfg.control.clpo, cfg.seed) if cfg.control.method == "clpo" else None
        self.set_controller(build_controller(cfg.control, r, cfg.seed, embed=embed, meta=meta, rewrite=rewrite))
        check_replay(cfg.replay, r, cfg.objective)
        check_guidance(r, cfg.objective)  # guide: hinted rollouts need an IS weight
        # no fixed step count: step() reports the run's progress towards whichever limit stops it
        self.replay = build_replay(cfg.replay, seed=cfg.seed, prompts_per_step=r.prompts_per_step, total_steps=0)
        self.value_probe = build_value_baseline(cfg.objective, self.tokenizer.pad_token_id, cfg.seed)  # poise
        self.dph_pool: list = []  # dph_rl: the initial policy's own samples (optim/dph.py)
        self.limits = RunLimits.from_config(cfg.train)  # what fit() runs to (fit(until=...) replaces them)
        self.eval_prompts = [self.tokenize(p) for p in self.task.eval[: cfg.train.eval_size]]
        self.pool = None  # rollout.workers > 0: Ray rollout workers (dist/) generate in place of the engine
        if r.workers:
            from rollwise.dist import WorkerPool

            self.pool = WorkerPool(cfg, self.model)
            self.pool.set_dtype(self.engine_dtype)
        self.state = TrainState(precision=precision.start_record(self.engine_dtype, self.compute_dtype))
        self.pipeline: Pipeline | None = None  # train.mode=async: the producer thread (started by step())
        self.queued: list[ScoredBatch] = []  # async: batches a resumed checkpoint holds, generated but untrained
        self.ref_model = None
        self.log: MetricsLog | None = None
        self.rollout_log: RolloutLog | None = None  # rollouts.jsonl, opened by prepare()
        self.stopped_by: str | None = None  # the limit that ended the last fit()
        self.resumed_from: Path | None = None  # the checkpoint prepare(resume=True) loaded
        self.config_changes: list = []  # what that resume changed (train/resume.py)
        self.last_tree: RolloutGroup | None = None  # the last step's first tree group, for trees.jsonl at the next eval

    def set_controller(self, controller) -> None:
        """Use ``controller`` (built from ``control.*``, or your own ``Controller`` subclass) and build
        the generator around it: a pruning controller (arrol) samples through its pruner, one that
        overrides ``should_continue`` is asked at every ``continue_every`` tokens of a rollout."""
        check_workers(self.cfg, controller)
        self.controller = controller
        pruner = controller if controller.prunes_in_generation else None  # arrol prunes inside generation
        gate = (lambda partial: controller.should_continue(partial, self.stats)) if controller.asks_should_continue else None
        if self.cfg.rollout.harness is not None:  # every rollout an agent harness's episode, through the endpoint
            self.generator = harness_sampler(self.cfg.rollout, self.sampling, self.tokenizer, controller)
            return
        if self.cfg.rollout.environment is not None:  # every rollout a multi-turn episode
            self.generator = episode_sampler(self.cfg.rollout, self.sampling, self.tokenizer, controller, self.sandbox)
            return
        self.generator = build_generator(self.cfg.rollout, self.sampling, self.decode, pruner=pruner, gate=gate,
                                         gate_every=controller.continue_every,
                                         encode=lambda p: encode_prompt(self.tokenizer, p))  # nudge's contexts

    # -- helpers the step calls -------------------------------------------------------------
    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def tokenize(self, prompt: Prompt) -> Prompt:
        if not prompt.token_ids:
            prompt.token_ids = encode_prompt(self.tokenizer, prompt)
        return prompt

    def prompt_source(self, cursor: int | None = None) -> PromptCursor:
        """The train stream at ``cursor`` (default: the run's data cursor), handing out tokenized prompts."""
        return PromptCursor(self.task.train, self.state.cursor if cursor is None else cursor, self.tokenize)

    def select_prompts(self) -> list[Prompt]:
        """This step's prompts, as the controller selects them (advances the data cursor)."""
        source = self.prompt_source()
        wanted = self.generator.prompts_wanted(self.cfg.rollout.prompts_per_step)
        prompts = self.controller.select_prompts(source, self.stats, wanted)
        self.state.cursor = source.cursor
        return prompts

    def prompts_wanted(self, step: int) -> int:
        """Fresh prompts step ``step`` samples: the strategy's count for ``rollout.prompts_per_step``,
        fewer in sync mode when replay serves part of the batch (async: replay comes on top)."""
        wanted = self.generator.prompts_wanted(self.cfg.rollout.prompts_per_step)
        return self.replay.fresh_prompts(wanted, step) if self.cfg.train.mode == "sync" else wanted

    def step_seed(self, step: int | None = None) -> int:
        """The seed of step ``step``'s rollouts (default: the current step; ``rollwise.seeds``)."""
        seed = self.cfg.seed if self.cfg.sampling_seed is None else self.cfg.sampling_seed
        return seeds.step_seed(seed, self.state.step if step is None else step)

    def sampling_policy(self) -> torch.nn.Module:
        """The copy of the policy that samples: the async producer's own, else the trained one."""
        return self.pipeline.model if self.pipeline is not None else self.model

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One step. Sync: collect this step's groups with the current policy, then train on them.
        Async: train on the batch the producer made ahead (starting it on the first call)."""
        self.replay.progress(self.state.step, self.limits.progress(self.state))  # ReMix's reincarnation point
        if self.cfg.train.mode == "async":
            batch, waited = self.take_from_pipeline()
            return self.train_on(batch, waited) | self.pipeline.metrics(self.state.step)
        batch = self.collect(self.state.step, self.state.cursor, self.pool or self.engine)
        self.state.cursor = batch.cursor
        return self.train_on(batch)

    def collect(self, step: int, cursor: int, engine) -> ScoredBatch:
        """Generate → Filter → Control for training step ``step``, reading the train stream from
        ``cursor``, sampling on ``engine``. Touches the controller, ``PromptStats`` and the
        generator, never the policy being trained (async mode runs this on the producer thread)."""
        clock, control, stats, group_size = Clock(), self.controller, self.stats, self.cfg.rollout.num_generations
        control.step, source = step, self.prompt_source(cursor)
        prompts = control.select_prompts(source, stats, self.prompts_wanted(step))
        budget = group_size * len(prompts)
        budgets = control.allocate(prompts, stats, budget)
        sampler = RoundSampler(self, step, engine, clock)  # one round: generate, score, record in stats
        with PromptPrefixes(control, engine, len(prompts)) as prefixes:  # extend rounds copy the prompts' prefixes
            groups, metrics, _ = sampler.sample(prompts, budgets, seeds.FIRST_ROUND)
            metrics |= self.generator.revise(groups, sampler)  # guide, scope: failed groups get guided rollouts
            metrics |= extend_rounds(control, stats, groups, sampler, budget - sum(budgets))  # xrpo, dars
            groups, refill = accept_and_refill(control, stats, source, groups, sampler, len(prompts), group_size)
        control.observe_step(groups, stats)
        if self.cfg.objective.old_logit_repair:  # right after sampling: the sampling version's own forward,
            policy = self.sampling_policy()         # in the update's precision (the ratio's other side)
            with compute(policy, self.compute_dtype):
                metrics |= record_old_logprobs(groups, {engine.version: policy}, self.update_spec(step).sampling,
                                               self.tokenizer.pad_token_id)
        metrics |= prefixes.metrics() | refill | control.metrics() | clock.metrics()
        tokens = sampler.tokens + control.forward_tokens()  # a selector's own policy forwards count too
        return ScoredBatch(step, groups, metrics, tokens, source.cursor)

    def train_on(self, batch: ScoredBatch, waited: float = 0.0) -> dict[str, float]:
        """Replay → Optimize on a collected batch: advantages, the groups to train, the policy update,
        the new weights to the engine."""
        cfg, start = self.cfg, time.perf_counter()
        step, metrics = self.state.step, dict(batch.metrics)
        if self.value_probe is not None:  # poise: each baseline from the states of the group's other rollouts
            metrics |= self.value_probe.assign(batch.groups, self.model)
        lr_scale = 1.0
        precision = functools.partial(compute, self.model, self.compute_dtype)  # the update's forwards' own
        if cfg.objective.vcpo:  # vcpo: b* per group from the sequence IS weights, this step's lr x ESS/N
            with precision():
                ratios = policy_log_ratios(self.model, batch.groups, self.update_spec(step).sampling,
                                           self.tokenizer.pad_token_id)
            lr_scale, vcpo_metrics = assign_vcpo(batch.groups, ratios, cfg.objective.vcpo_clamp)
            metrics |= vcpo_metrics
        metrics |= assign_advantages(batch.groups, cfg.objective)  # within the groups as sampled
        outcome.count_step(self.state, batch.groups, metrics)  # reward failures, no reward spread: summary.json
        if self.rollout_log is not None:  # a sample of the scored groups for the report
            self.rollout_log.log(step + 1, batch.groups)
        self.last_tree = next((g for g in batch.groups if g.tree is not None), None)
        # replay: the groups to train (fresh and kept ones, with their own log-probs, versions, advantages)
        groups, replayed = self.replay.compose(batch.groups, step=step, version=step)
        metrics |= replayed
        if self.replay.reincarnate(step) and self.ref_model is not None:  # ReMix: the reference moves to π_θ
            self.ref_model.load_state_dict(self.model.state_dict())
            self.state.reference_moved_at = step
        if cfg.objective.top_entropy_step_quantile < 1:  # high_entropy_steps' step half (optim/entropy_steps.py)
            groups, kept = keep_high_entropy_steps(groups, cfg.objective.top_entropy_step_quantile)
            metrics |= kept
        tensors = build_batch(groups, self.tokenizer.pad_token_id, cfg.objective.mask_truncated_completions)
        optimizer = update_optimizer(self, step, batch.groups, precision)  # + dph_rl's, masa's terms
        with scaled_lr(self.optimizer, lr_scale):  # dph_rl, masa: the optimizer adds their terms' gradients
            metrics |= policy_update(self.model, optimizer, tensors, self.update_spec(step), self.ref_model)
        if optimizer is not self.optimizer:
            metrics |= optimizer.metrics()
        if cfg.objective.dph_coef > 0:
            metrics["dph/pool"] = float(len(self.dph_pool))
        self.state.skipped_updates += int(metrics["update/skipped_nonfinite"])  # a NaN/inf never reached the weights
        metrics["train/skipped_updates"] = float(self.state.skipped_updates)
        metrics["lr"] = self.scheduler.get_last_lr()[0]  # the LR this step trained with
        self.scheduler.step()  # once per training step, however many passes the update made
        metrics |= self.guard.check(metrics, (self.engine, self.pipeline, self.pool))  # past the bound: auto → fp32
        self.state.engine_fallback = self.guard.fell_back
        self.engine.load_weights(self.model)  # in-process: parameters are shared, only the version moves
        if self.pool is not None and self.pipeline is None:  # sync with workers: they load at next use
            self.pool.load_weights(self.model)
        update = time.perf_counter() - start
        self.state.step += 1
        self.state.generated_tokens += batch.tokens
        metrics |= staleness_metrics(groups, step)
        if self.pipeline is not None:  # async: the batch was sampled concurrently; the step is the wait + the update
            metrics |= {"time/update": update, "time/wait": waited, "time/step": update + waited}
        else:
            metrics |= {"time/update": update, "time/step": metrics.get("time/step", 0.0) + update}
        return metrics | rollout_metrics(groups) | {
            "tokens/generated": float(batch.tokens), "tokens/total": self.state.generated_tokens}

    def update_spec(self, step: int) -> UpdateSpec:
        """Step ``step``'s policy update from ``objective.*``, ``optim.*`` and the rollout sampling
        settings. Optimizer passes: the most any source asks — ``optim.num_iterations``, the
        controller's ``update_passes`` (DARS-B), the replay method's ``update_passes(step)`` (ReMix)."""
        o, r = self.cfg.optim, self.cfg.rollout
        passes = max(o.num_iterations, self.controller.update_passes, self.replay.update_passes(step))
        return UpdateSpec(self.cfg.objective, passes=passes, max_len=r.max_new_tokens,
                          micro_batch_size=o.micro_batch_size, max_grad_norm=o.max_grad_norm,
                          temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                          skip_zero_advantage=o.skip_zero_advantage, logits_budget_mb=o.logits_budget_mb,
                          packed=self.packed, share_prompts=o.share_prompts, compute_dtype=self.compute_dtype)

    # -- async: the producer (train/pipeline.py) -------------------------------------------
    def take_from_pipeline(self) -> tuple[ScoredBatch, float]:
        """The batch of the current step from the producer (started on the first call, from the
        batches a resumed checkpoint holds), and how long the trainer waited for it."""
        if self.pipeline is None:
            self.pipeline = Pipeline(self, self.cfg.train.max_staleness, self.queued)
            self.queued = []
            self.pipeline.start()
        self.publish()
        return self.pipeline.take(self.state.step)

    def publish(self) -> None:
        """Async: hand the weights of the current step to the producer (``fit`` does it after the
        step's eval and checkpoint, so a checkpoint at step s always holds batches s … s+k−1)."""
        if self.pipeline is not None:
            self.pipeline.publish(self.state.step)

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

    # -- around the step --------------------------------------------------------------------
    def prepare(self, resume: bool = False, on_sft_step=None, overwrite: bool = False) -> None:
        """Fresh run: write config, run the SFT warm start, save the RL start. Resume: load the latest
        checkpoint. A fresh run refuses a directory holding a run unless ``overwrite`` (``train/rundir.py``)."""
        ckpt = rundir.check_start(self.run_dir, resume, overwrite)
        if ckpt is not None:  # keys that may change on resume apply and are recorded; others are refused first
            config = self.cfg.model_dump(mode="json")
            started = resume_rules.start_precision(ckpt) or precision.auto_record(self.model)  # older: auto here
            self.config_changes = resume_rules.check_changes(self.run_dir, config, started)
            restore_run(self, ckpt)
            if self.state.engine_fallback:  # the guard had moved the engine to fp32 before the checkpoint
                self.guard.fall_back((self.engine, self.pool))
            resume_rules.record_changes(self.run_dir, self.state.step, self.config_changes, config)
            self.resumed_from = ckpt
        else:
            rundir.start_fresh(self.run_dir, self.cfg.model_dump(mode="json"), overwrite=overwrite)
            if self.cfg.sft.steps:
                warm_start(self, on_sft_step, self.run_dir / "sft.jsonl")  # demonstrations rendered as its episodes
            rundir.save_init_model(self.run_dir, self.cfg, self.model, self.tokenizer)
        self.ref_model = reference_model(self.cfg, self.model, self.init_model_dir(), self.engine.device)
        if ckpt is not None and self.state.reference_moved_at is not None and self.cfg.model.lora is None:
            load_reference(ckpt, self.ref_model)  # ReMix moved it before the checkpoint
        self.embed_model = embedding_model(self.cfg, self.model, self.ref_model, self.init_model_dir(),
                                           self.engine.device)
        self.log = MetricsLog(self.run_dir, resume_from_step=self.state.step if ckpt else None,
                              report_to=self.cfg.train.report_to, config=self.cfg.model_dump(mode="json"))
        self.rollout_log = RolloutLog(self.run_dir, self.cfg.train.log_rollouts, self.cfg.train.rollouts_mb,
                                      resume_from_step=self.state.step if ckpt else None,
                                      decode=self.tokenizer.decode)  # special tokens kept: the prompt as rendered

    def init_model_dir(self) -> Path:
        """The directory holding the RL starting weights (``init_model/`` or the recorded source)."""
        return rundir.init_model_dir(self.run_dir)

    def evaluate(self) -> EvalResult:
        tc = self.cfg.train
        return evaluate(
            self.engine, self.eval_prompts, self.judge, self.decode, max_new_tokens=self.cfg.rollout.max_new_tokens,
            stop_token_ids=self.stop_ids, samples=tc.eval_samples, temperature=self.cfg.rollout.temperature,
            seed=self.cfg.seed, keep=tc.log_samples,
            episodes=self.generator if self.episodic else None,
        )

    def start_eval(self) -> EvalResult:
        """The eval of the starting weights: from ``train.eval_cache`` when another run computed it (same
        weights, prompts, judge, settings and machine: ``rollwise.eval.cache``), else computed (and kept there)."""
        directory = self.cfg.train.eval_cache
        if directory is None or self.episodic:
            return self.evaluate()
        from rollwise.eval import cache

        key = cache.start_key(self.model, self.engine, self.cfg, self.eval_prompts, self.stop_ids)
        return cache.load(directory, key) or cache.store(directory, key, self.evaluate())

    def record_eval(self) -> EvalResult | None:
        if not self.eval_prompts:  # no eval split: training goes on, summary.json says there was no eval
            return None
        result = self.start_eval() if self.state.step == 0 else self.evaluate()
        if self.state.initial_accuracy is None:
            self.state.initial_accuracy = result.accuracy
        self.state.last_accuracy = result.accuracy
        if result.solved:  # support_diag: shrinkage/expansion against the first sampled eval (eval/support.py)
            self.state.support_base, shift = track(self.state.support_base, result.prompt_ids, result.solved)
            result.support.update(shift)
        self.log.log(self.state.step, result.metrics())
        self.log.log_samples(self.state.step, result.samples)
        self.log.log_eval(self.state.step, result.prompt_ids, result.correct)
        if self.last_tree is not None:  # tree strategies: one training group's tree per eval
            self.log.log_tree(self.state.step, tree_record(self.last_tree, self.decode))
            self.last_tree = None
        return result

    def checkpoint(self) -> Path:
        """Save everything a resumed run needs, atomically. Async: first hold the producer at a batch
        boundary with every batch that needs an older policy version made; those generated but not
        yet trained batches are saved too (``pipeline.pt``), with the producer's data cursor."""
        queued = None
        self.count_cpu()
        if self.pipeline is not None:
            queued, self.state.cursor = self.pipeline.barrier(self.state.step)
        try:
            return save_run(self, queued)
        finally:
            if self.pipeline is not None:
                self.pipeline.release()

    def fit(self, until: RunLimits | None = None, on_step: Callable[[int, dict], None] | None = None,
            on_eval: Callable[[int, EvalResult], None] | None = None) -> dict:
        """The outer loop: step until ``until`` (default: the recipe's ``train`` limits), evaluating
        every ``train.eval_every`` steps, at the start and at the end, checkpointing every
        ``train.checkpoint_every`` steps and at the end; writes ``summary.json`` and returns it.

        Call ``prepare()`` first. ``on_step(step, metrics)`` and ``on_eval(step, result)`` let a
        caller show progress; the loop itself never prints.
        """
        tc, until = self.cfg.train, until or RunLimits.from_config(self.cfg.train)
        self.limits = until
        if self.log is None:
            raise RuntimeError("Trainer.fit: call prepare() first")
        if self.state.step == 0 and self.state.initial_accuracy is None:
            result = self.record_eval()
            if on_eval and result is not None:
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
                if on_eval and result is not None:
                    on_eval(step, result)
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or last:
                self.checkpoint()
            if not last:
                self.publish()
        self.stop_pipeline()
        summary = self.summary()
        rundir.write_summary(self.run_dir, summary)
        return summary

    def count_cpu(self) -> None:
        """Add this process's CPU time since the last count to ``state.cpu_seconds`` (a resumed run's
        loaded state gets its new session's time, model load included)."""
        now = time.process_time()
        self.state.cpu_seconds += now - self._cpu_mark
        self._cpu_mark = now

    def summary(self) -> dict:
        self.count_cpu()
        return run_summary(self.state, self.cfg, self.task.name, self.judge.name, bool(self.eval_prompts)) | \
            precision.summary(self.guard, (self.compute_dtype, self.compute_dtype_reason))

    def write_report(self) -> Path | None:
        """Write ``report.html`` into the run directory; a failure is a warning, never a failed run."""
        return rundir.write_report(self.run_dir)

    @property
    def episodic(self) -> bool:
        """Every rollout is an episode (an environment's or a harness's): evals run them too."""
        return self.cfg.rollout.environment is not None or self.cfg.rollout.harness is not None

    def close(self) -> None:
        """Flush the logs and stop what the run started (the async producer, the sandbox's workers, the endpoint)."""
        if hasattr(self.generator, "close"):
            self.generator.close()
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
