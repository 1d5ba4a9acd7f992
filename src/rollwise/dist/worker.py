"""A rollout worker: the process behind one Ray actor of ``rollout.workers``.

It holds what Generate (and, with ``rollout.score_on: workers``, Filter) needs and nothing of
Optimize: a copy of the policy, its own engine, the run's rollout strategy, the reward
functions and its own code sandbox. ``run`` samples (and scores) one shard of a step's
prompts with the weights of a given sync id, loading them from the object store first when
it holds older ones. It never decides which prompts or how many rollouts: the driver's
controller does, and sends the step's whole prompt list with budget 0 for the prompts other
workers sample, so that every request's seed is the one the in-process run would use.

This module imports no Ray at module level: the pool wraps ``RolloutWorker`` with
``ray.remote`` when a run asks for workers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from rollwise.types import Prompt, RolloutGroup


@dataclass
class ShardResult:
    """What a worker sends back for one shard: the groups of the prompts it sampled, in order."""

    indices: list[int]  # positions, in the step's prompt list, of the prompts this shard sampled
    groups: list[RolloutGroup]  # scored when the worker scores
    metrics: dict[str, float]  # the strategy's own (and the reward functions' error counts)
    sampled_tokens: int  # tokens the worker's engine sampled for the shard
    seconds: dict[str, float] = field(default_factory=dict)  # load (weight sync), generate, score


class RolloutWorker:
    """``config`` is the run's config as JSON data and ``config_type`` its class (``RunConfig``),
    handed in by the driver: dist/ sits below train/ and imports nothing of it."""

    def __init__(self, config: dict, config_type: type, *, threads: int = 1, score: bool = True,
                 device: str = "cpu"):
        from rollwise.engine import make_engine
        from rollwise.filter.registry import resolve_rewards
        from rollwise.filter.sandbox import Sandbox
        from rollwise.generate import build_generator, sampling_params
        from rollwise.model.load import load_model_and_tokenizer

        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker start, in the driver's log
        cfg = config_type.model_validate(config)
        torch.set_num_threads(threads)
        self.sandbox = Sandbox(cfg.sandbox)
        task = cfg.task.build(cfg.seed, self.sandbox)
        self.model, self.tokenizer = load_model_and_tokenizer(cfg.model.model_copy(update={"device": device}),
                                                              seed=cfg.seed)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.engine = make_engine(self.model, pad_token_id=self.tokenizer.pad_token_id,
                                  max_batch_size=cfg.rollout.max_batch_size, seed=cfg.seed, kind=cfg.rollout.engine)
        self.synced = -1  # the sync id of the weights held (-1: none yet, never sample with them)
        params = sampling_params(cfg.rollout, self.tokenizer)
        if cfg.rollout.environment is not None:  # episodes: the environment runs where sampling runs
            from rollwise.generate.episode import EpisodeSampler
            from rollwise.tasks.environment import episode_parts

            envs, fmt = episode_parts(cfg.rollout, self.tokenizer, self.sandbox)
            self.generator = EpisodeSampler(params, self.tokenizer, envs, fmt, cfg.rollout.max_turns)
        else:
            self.generator = build_generator(cfg.rollout, params, self.decode)
        self.reward_fns = resolve_rewards(cfg.rewards, task, self.sandbox, warn=False)[0] if score else None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def run(self, prompts: list[Prompt], budgets: list[int], seed: int, sync: int, version: int,
            weights: list, dtype=None) -> ShardResult:
        """Sample ``budgets[i]`` rollouts of ``prompts[i]`` (0: not this worker's) with the weights
        of sync id ``sync`` (``weights`` = [their object ref], loaded when newer than the held ones),
        tokens tagged with policy ``version``, in precision ``dtype`` (the driver's choice, None = the
        model's own: the engine keeps its own cast copy); score them when this worker scores."""
        start = time.perf_counter()
        if dtype is not None and dtype != self.engine.dtype and hasattr(self.engine, "set_dtype"):
            self.engine.set_dtype(dtype)  # re-cast from the worker's model, which holds the latest weights loaded
        if sync != self.synced:
            self.load(weights[0])
            self.synced = sync
        self.engine.version = version
        loaded = time.perf_counter()
        before = self.engine.stats.decode_tokens
        groups, metrics = self.generator.generate(self.engine, prompts, budgets, seed=seed)
        sampled = self.engine.stats.decode_tokens - before
        generated = time.perf_counter()
        indices = [i for i, b in enumerate(budgets) if b > 0]
        groups = [groups[i] for i in indices]
        if self.reward_fns is not None:
            from rollwise.filter.rewards import score_groups

            metrics |= score_groups(groups, self.reward_fns)
        done = time.perf_counter()
        return ShardResult(indices, groups, metrics, sampled,
                           {"load": loaded - start, "generate": generated - loaded, "score": done - generated})

    def load(self, ref) -> None:
        import ray

        from rollwise.dist.pool import from_numpy
        from rollwise.model.lora import load_policy_state

        load_policy_state(self.model, from_numpy(ray.get(ref)))  # model.lora: the adapter alone
        self.engine.load_weights(self.model)

    def generator_state(self) -> dict:
        return self.generator.state_dict()

    def load_generator_state(self, state: dict) -> None:
        self.generator.load_state_dict(state)

    def close(self) -> None:
        self.sandbox.close()
