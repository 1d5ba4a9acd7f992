"""``WorkerPool``: the step's prompts sampled (and scored) by ``rollout.workers`` Ray actors.

The trainer hands the pool to ``collect`` where it would hand its engine: the pool keeps the
part of the engine contract the loop reads (``engine.protocol.PolicySampler``: ``version``,
``load_weights``, ``stats.decode_tokens``) and, in place of a strategy run on a local engine,
``RolloutPool``'s ``generate``
splits the step's prompts into one shard per live worker (balanced by rollout budget, in
prompt order), sends each worker the whole prompt list with budget 0 for the prompts it does
not sample, and puts the groups back in prompt order as the shards come in.

**Weights.** ``load_weights`` only marks the policy as changed; the next ``generate`` puts
its state dict in the object store once (a sync id; as numpy arrays, which Ray shares between
processes of a node without copying), and each worker loads it before its
shard when it holds an older one. ``time/weight_sync`` is that step's put plus the slowest
worker's load.

**Faults.** A shard whose worker died (killed actor, OOM, lost node: Ray's ``RayActorError``,
``WorkerCrashedError``, ``OutOfMemoryError``)
is re-issued to the live worker with the least work queued; its seeds are the prompts',
not the worker's, so the completions are the ones it would have made. The lost worker is
replaced by a new actor while the run has restarts left (``rollout.worker_restarts``); with
no live worker left the step fails with a clear error. An error raised by the worker's own
code (a reward function's import, a bad config) is not a fault and is raised as is. Per call:
``dist/prompts_sent`` = ``dist/prompts_returned`` (checked: a mismatch raises),
``dist/lost_workers``, ``dist/reissued_prompts``, ``dist/restarts``; ``dist/workers`` alive.

Strategy state (TreePO's entropy window) lives on each worker and is checkpointed per worker;
a replaced worker starts with an empty one.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from rollwise.config import ConfigError
from rollwise.engine.protocol import PolicySampler
from rollwise.model.lora import policy_state
from rollwise.types import Prompt, RolloutGroup

log = logging.getLogger("rollwise")

# metrics summed over shards (counts); every other strategy metric is a mean, weighted by the
# shard's prompts (leaves_per_prompt, shared_token_ratio, ...)
SUMMED = ("forks", "wasted_tokens", "fallback_prompts", "branches", "pruned", "errors")


def connect():
    """``ray``, initialised: join the cluster at ``RAY_ADDRESS`` when it is set, else start a
    local one (or keep the one this process already has)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("rollout.workers > 0 runs rollout workers on Ray, which is not installed: "
                          "pip install 'rollwise[ray]' (or set rollout.workers=0)") from None
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        if address is None:
            loopback_only()
        ray.init(address=address, include_dashboard=False if address is None else None, log_to_driver=True,
                 configure_logging=False)
    return ray


def loopback_only() -> None:
    """Make a local Ray cluster this process starts bind every service to 127.0.0.1.

    Ray's node address on Linux is the machine's network address (what other nodes would reach),
    so a one-machine cluster listens on it: any host that can reach this machine could talk to the
    GCS and the raylet. Ray binds to loopback when its "cluster" switch is off (as on macOS and
    Windows); the switch is read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when ``ray`` is
    imported, so it is set both in the environment (workers and a ``ray`` imported later) and on
    the imported module. A cluster joined through ``RAY_ADDRESS`` is left as its owner started it.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@runtime_checkable
class RolloutPool(PolicySampler, Protocol):
    """A sampler that runs the rollout strategy itself (``remote``), where the loop would run its
    strategy on a local engine: what the loop calls on ``WorkerPool``."""

    remote: bool  # True: the loop calls generate() here instead of its generator on an engine
    scores: bool  # the groups come back scored (rollout.score_on=workers)

    def generate(self, prompts: list[Prompt], budgets: list[int], seed: int) -> tuple[list[RolloutGroup], dict]:
        """The groups of ``prompts`` (``budgets[i]`` rollouts each) and the step's metrics, as a Generator's."""
        ...

    def generator_state(self) -> dict:
        """The strategy's state, for the checkpoint ({} when stateless)."""
        ...

    def load_generator_state(self, state: dict) -> None:
        ...

    def close(self) -> None:
        ...


@dataclass
class PoolStats:
    decode_tokens: int = 0  # tokens the workers sampled (what the loop counts as generated)


class WorkerPool:
    remote = True  # the loop asks the pool, not a local strategy, to generate

    def __init__(self, cfg, model, *, worker_cls=None) -> None:
        ray = connect()
        from rollwise.dist.worker import RolloutWorker

        r = cfg.rollout
        res = r.worker_resources
        self.ray, self.model = ray, model
        self.scores = r.score_on == "workers"
        self.restarts_left = r.worker_restarts
        options = {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus, "max_restarts": 0, "max_task_retries": 0}
        if res.memory is not None:
            options["memory"] = res.memory
        if res.resources:
            options["resources"] = dict(res.resources)
        self.actor = ray.remote(worker_cls or RolloutWorker).options(**options)
        self.init_args = (cfg.model_dump(mode="json"), type(cfg))  # the worker validates it with the driver's class
        self.init_kwargs = {"threads": max(1, int(res.num_cpus)), "score": self.scores,
                            "device": "cuda" if res.num_gpus > 0 else "cpu"}
        self.workers = [self.spawn() for _ in range(r.workers)]
        self.version = 0  # the policy version tokens are tagged with (the loop sets it as it sets an engine's)
        self.sync = 0  # bumped by load_weights; put in the object store at the next generate
        self.weights: tuple[int, object] | None = None  # (sync id, object ref) of the state dict put last
        self.stats = PoolStats()
        self.dtype = None  # the workers' sampling precision (set_dtype)
        self.after_dispatch: Callable[[WorkerPool], None] | None = None  # tests: kill a worker mid-step

    def spawn(self):
        return self.actor.remote(*self.init_args, **self.init_kwargs)

    # -- the engine contract the loop reads ------------------------------------------------------
    def set_dtype(self, dtype) -> None:
        """The workers' engines sample in ``dtype`` (a ``torch.dtype``; None = the model's own) from
        their next shard on (``rollout.engine_dtype``, chosen by the driver; the mismatch guard's fallback)."""
        self.dtype = dtype

    def load_weights(self, source) -> int:
        """The policy changed: workers load ``source``'s state dict (the model or a state dict) before
        their next shard. Returns the new version, as an engine does."""
        self.model = source
        self.sync += 1
        self.version += 1
        return self.version

    # -- generation ------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], budgets: list[int], seed: int) -> tuple[list[RolloutGroup], dict]:
        """The groups of ``prompts`` (``budgets[i]`` rollouts each), sampled by the workers, scored
        when they score; with the merged strategy metrics and this call's dist/ counters."""
        ray = self.ray
        exc = ray.exceptions
        died = (exc.RayActorError, exc.WorkerCrashedError, exc.OutOfMemoryError)  # the worker, not its code, failed
        put_start = time.perf_counter()
        sync, ref = self.publish()
        put = time.perf_counter() - put_start
        prompts_ref = ray.put(prompts)
        lost = reissued = restarts = 0
        shards = balance(budgets, len(self.workers))
        pending = {}  # future -> (worker, indices)

        def send(worker, indices):
            mine = [b if i in indices else 0 for i, b in enumerate(budgets)]
            pending[worker.run.remote(prompts_ref, mine, seed, sync, self.version, [ref],
                                      dtype=self.dtype)] = (worker, indices)

        for worker, indices in zip(self.workers, shards):
            if indices:
                send(worker, set(indices))
        if self.after_dispatch is not None:
            self.after_dispatch(self)
        results, loads = [], [0.0]
        while pending:
            (future,), _ = ray.wait(list(pending), num_returns=1)
            worker, indices = pending.pop(future)
            try:
                result = ray.get(future)
            except died as err:
                lost += 1
                restarts += self.replace(worker, err)
                if not self.workers:
                    raise RuntimeError(f"every rollout worker died (rollout.worker_restarts={self.restarts_left} "
                                       f"left): {err}") from err
                queued = {w: sum(1 for v in pending.values() if v[0] is w) for w in self.workers}
                survivors = [w for w in self.workers if w is not worker] or self.workers
                send(min(survivors, key=lambda w: (queued.get(w, 0), self.workers.index(w))), indices)
                reissued += len(indices)
                continue
            results.append(result)
            loads.append(result.seconds.get("load", 0.0))
        groups, metrics = self.merge(prompts, budgets, results)
        self.stats.decode_tokens += sum(r.sampled_tokens for r in results)
        metrics |= {"dist/workers": float(len(self.workers)), "dist/lost_workers": float(lost),
                    "dist/reissued_prompts": float(reissued), "dist/restarts": float(restarts),
                    "time/weight_sync": put + max(loads),  # ~0 when the workers already held this version
                    "time/worker_generate": max((r.seconds["generate"] for r in results), default=0.0),
                    "time/worker_score": max((r.seconds["score"] for r in results), default=0.0)}
        return groups, metrics

    def publish(self) -> tuple[int, object]:
        """The current weights' (sync id, object ref), put in the object store if not yet."""
        if self.weights is None or self.weights[0] != self.sync:
            # model.lora: the adapter alone (workers build the same base from the run's config)
            source = policy_state(self.model) if hasattr(self.model, "state_dict") else self.model
            self.weights = (self.sync, self.ray.put(to_numpy(source)))
        return self.weights

    def merge(self, prompts: list[Prompt], budgets: list[int],
              results: list) -> tuple[list[RolloutGroup], dict[str, float]]:
        """The shards' groups in prompt order (each holding the driver's own Prompt), their metrics merged."""
        by_index: dict[int, RolloutGroup] = {}
        for res in results:
            for i, g in zip(res.indices, res.groups):
                g.prompt = prompts[i]  # the driver's object: controllers and replay key on it
                by_index[i] = g
        wanted = [i for i, b in enumerate(budgets) if b > 0]
        if sorted(by_index) != wanted:
            raise RuntimeError(f"rollout workers returned groups for prompts {sorted(by_index)}, expected {wanted}")
        metrics = merge_metrics([(len(res.indices), res.metrics) for res in results])
        if self.scores:
            from rollwise.filter.rewards import component_means

            metrics |= component_means([by_index[i] for i in wanted])
        return [by_index[i] for i in wanted], metrics | {"dist/prompts_sent": float(len(wanted)),
                                                          "dist/prompts_returned": float(len(by_index))}

    def replace(self, worker, err) -> int:
        """Drop a dead worker; start a new one in its place while restarts are left (1 if started)."""
        i = self.workers.index(worker)
        log.warning("rollout worker %d died (%s); its prompts go to the others", i, type(err).__name__)
        self.ray.kill(worker)  # dead already, or alive after an OOM-killed task: either way, gone
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.workers[i] = self.spawn()
            return 1
        del self.workers[i]
        return 0

    # -- state ---------------------------------------------------------------------------------
    def generator_state(self) -> dict:
        """Each worker's strategy state ({} for stateless strategies), for the checkpoint."""
        states = self.ray.get([w.generator_state.remote() for w in self.workers])
        return {"workers": states} if any(states) else {}

    def load_generator_state(self, state: dict) -> None:
        for w, s in zip(self.workers, state.get("workers", [])):
            self.ray.get(w.load_generator_state.remote(s))

    def close(self) -> None:
        for w in self.workers:
            try:
                self.ray.get(w.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 — a dead worker has nothing to close
                pass
            self.ray.kill(w)
        self.workers = []


def balance(budgets: list[int], n: int) -> list[list[int]]:
    """Prompt indices per worker: each prompt (in order, budget 0 skipped) to the worker with the
    least rollouts so far (ties: the lowest index) — deterministic, balanced by budget.

    >>> balance([8, 8, 8, 8, 0], 2)
    [[0, 2], [1, 3]]
    >>> balance([12, 4, 4, 4], 2)
    [[0], [1, 2, 3]]
    """
    shards, load = [[] for _ in range(n)], [0] * n
    for i, b in enumerate(budgets):
        if b > 0:
            w = min(range(n), key=lambda k: (load[k], k))
            shards[w].append(i)
            load[w] += b
    return shards


def merge_metrics(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Shards' strategy metrics as one step's: counts (``SUMMED`` suffixes) summed, the rest
    averaged weighted by each shard's prompts.

    >>> merge_metrics([(1, {"tree/forks": 2.0, "tree/leaves_per_prompt": 4.0}),
    ...                (3, {"tree/forks": 1.0, "tree/leaves_per_prompt": 8.0})])
    {'tree/forks': 3.0, 'tree/leaves_per_prompt': 7.0}
    """
    keys = list(dict.fromkeys(k for _, m in parts for k in m))
    out = {}
    for k in keys:
        have = [(w, m[k]) for w, m in parts if k in m]
        if k.rsplit("/", 1)[-1] in SUMMED:
            out[k] = float(sum(v for _, v in have))
        else:
            total = sum(w for w, _ in have)
            out[k] = float(sum(w * v for w, v in have) / total) if total else float(have[0][1])
    return out


def to_numpy(state: dict) -> dict:
    """A state dict as numpy arrays (bfloat16 as its int16 bits, with the dtype's name): Ray keeps
    numpy arrays in shared memory and a worker on the node reads them without a copy."""
    out = {}
    for k, v in state.items():
        t = v.detach().cpu()  # a view of a CPU parameter: ray.put copies it into the object store
        out[k] = (t.view(torch.int16).numpy(), "bfloat16") if t.dtype == torch.bfloat16 else (t.numpy(), None)
    return out


def from_numpy(state: dict) -> dict:
    """``to_numpy``'s inverse (zero-copy views: ``load_state_dict`` copies them into the model)."""
    out = {}
    for k, (a, dtype) in state.items():
        with warnings.catch_warnings():  # Ray's shared arrays are read-only; nothing writes to these views
            warnings.simplefilter("ignore", UserWarning)
            t = torch.from_numpy(a)
        out[k] = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return out
