"""``train.mode: async``: generation runs ahead of the update, at most ``max_staleness`` versions behind.

The producer/consumer boundary is a queue of ``ScoredBatch``es (``train/collect.py``: scored
``RolloutGroup``s whose tokens carry the policy version that sampled them). The producer is a thread with its
own copy of the policy and its own engine; it runs the trainer's ``collect`` (Generate →
Filter → Control) for step after step. The consumer is the trainer: it takes batch ``s``,
updates the policy, and publishes the new weights as version ``s + 1``. On Ray (``dist/``)
the producer becomes a set of worker actors behind the same boundary.

**Pacing, not discarding.** Batch ``s`` is sampled by exactly version ``max(0, s − k)``
(``k = max_staleness``): the producer waits until the trainer has published that version and
loads it — never a newer one — before it starts the batch. Staleness is bounded by
construction (every trained token is ``≤ k`` versions old, ``staleness/max``), nothing is
ever dropped (``async/dropped`` is 0: dropping stale groups biases the data toward short
rollouts), and the run is a function of its seed alone, not of thread timing:

- ``k = 0`` samples every batch with the weights the synchronous loop would use, so it
  reproduces ``mode: sync`` exactly (same completions, rewards, losses; tested);
- a checkpoint is a barrier: the producer first finishes every batch that needs a version
  older than the checkpoint's weights (batches ``s … s + k − 1``) and those queued batches go
  into the checkpoint (``pipeline.pt``, written with the rest, atomically); a run killed at
  any moment resumes from its last checkpoint, loses no generated batch and continues as the
  uninterrupted run would (tested with SIGKILL).

Weights: the trainer's parameters (``model.lora``: its adapter only; the frozen base tensors
are shared with the producer's copy, not duplicated) are copied into a snapshot per version
(kept while a future batch may need it: at most ``k + 1``), and the producer copies a snapshot into its
own model at a batch boundary. Threads: torch's intra-op thread count is process-wide, so
both sides run with ``train.generation_threads`` (= ``train.update_threads``) threads each;
on two cores, one each.

Conservation, checked every step: ``async/started = async/trained + async/in_flight``
(batches), where in flight = queued + being generated (+ a batch whose collection raised:
the trainer still trains what was queued before it, then re-raises the producer's error).

Source: AReaL ("AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language
Reasoning", 2025), staleness-bounded admission and the decoupled PPO objective
(``objective.method: decoupled_ppo``; with ``max_staleness >= 1`` every objective whose recipe
sets no ``tis_mode`` gets its ``token_truncate`` weight on the behaviour/proximal gap —
``sequence_mask``, the sync default, is a 0/1 filter that would train stale tokens at weight 1).
Departures: admission is per batch (a step's groups), not per request; a batch is sampled
entirely by one version (no weight update inside a batch), which makes staleness exactly ``k``
after warm-up rather than at most ``k``.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import torch

from rollwise.engine import make_engine
from rollwise.model.lora import copy_policy, load_policy_state, policy_state


# metrics that depend on thread timing (how far ahead the producer happened to be): a resumed
# run cannot reproduce them and the run-file comparison skips them, as it skips time/*
TIMING_METRICS = ("async/started", "async/in_flight", "async/queued", "async/generate_idle_s", "async/update_idle_s")


class PipelineError(RuntimeError):
    """The producer thread failed; the trainer re-raises it with the producer's traceback chained."""


class Pipeline:
    def __init__(self, trainer, max_staleness: int, queued: list | None = None) -> None:
        self.trainer, self.k = trainer, max_staleness
        cfg = trainer.cfg
        self.model = copy_policy(trainer.model).eval()  # the producer's own copy of the policy (LoRA: of the adapter)
        for p in self.model.parameters():
            p.requires_grad_(False)
        if trainer.pool is not None:  # rollout workers (dist/): the pool loads this copy's weights
            self.engine = trainer.pool
            self.engine.load_weights(self.model)
        else:
            self.engine = make_engine(self.model, pad_token_id=trainer.tokenizer.pad_token_id,
                                      max_batch_size=cfg.rollout.max_batch_size, seed=cfg.seed, kind=cfg.rollout.engine,
                                      dtype=trainer.guard.dtype)  # its own low-precision copy of this copy
        self.dtype = None  # set_dtype: the precision the producer's engine re-casts to at its next weight load
        self.engine.version = trainer.state.step
        self.queue: deque = deque(queued or [])
        self.next_step = trainer.state.step + len(self.queue)  # the next batch the producer makes
        self.cursor = trainer.state.cursor  # the stream after the queued batches (checkpoints record it so)
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self.cond = threading.Condition()
        self.busy = False  # the producer is collecting a batch
        self.holding = False  # a checkpoint is being written: the producer must not start a batch
        self.stopping = False
        self.error: BaseException | None = None
        self.failed = 0  # batches begun that raised (the run stops at the next take once the queue is empty)
        self.started = trainer.state.step + len(self.queue)  # batches begun since step 0
        self.idle = {"generate": 0.0, "update": 0.0}  # seconds each side waited for the other
        self.thread = threading.Thread(target=self._run, name="rollwise-producer", daemon=True)
        self.publish(trainer.state.step)
        if self.target(self.next_step) < trainer.state.step:
            raise RuntimeError(f"async pipeline: the next batch (step {self.next_step}) needs policy version "
                               f"{self.target(self.next_step)}, older than the weights at step {trainer.state.step}; "
                               "a checkpoint must hold the batches generated ahead (pipeline.pt)")

    # -- the trainer's side ---------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def set_dtype(self, dtype) -> None:
        """The producer's engine samples in ``dtype`` from its next batch on (the mismatch guard's fallback)."""
        self.dtype = dtype

    def publish(self, version: int) -> None:
        """The trainer's current weights become ``version`` (a snapshot the producer may load)."""
        if version in self.snapshots:
            return
        snap = {n: t.detach().clone() for n, t in policy_state(self.trainer.model).items()}
        with self.cond:
            self.snapshots[version] = snap
            oldest = self.target(self.next_step)  # no batch still to make needs an older version
            for v in [v for v in self.snapshots if v < oldest]:
                del self.snapshots[v]
            self.cond.notify_all()

    def take(self, step: int):
        """Batch ``step`` (waiting for the producer if it is not ready); the wait is update-side idle time."""
        start = time.perf_counter()
        with self.cond:
            while not self.queue and self.error is None:
                self.cond.wait(0.5)
            if not self.queue:  # batches made before a failure are still trained
                self._raise()
            batch = self.queue.popleft()
            self.cond.notify_all()
        if batch.step != step:
            raise RuntimeError(f"async pipeline: expected the batch of step {step}, got step {batch.step}")
        waited = time.perf_counter() - start
        self.idle["update"] += waited
        return batch, waited

    def barrier(self, step: int) -> tuple[list, int]:
        """Let the producer finish every batch that needs a version older than ``step`` (the
        checkpoint's weights), then hold it until ``release()``; return the queued batches and the
        producer's data cursor (what the checkpoint records)."""
        with self.cond:
            while (self.next_step < step + self.k or self.busy) and self.error is None:
                self.cond.wait(0.5)
            self._raise()
            self.holding = True
            return list(self.queue), self.cursor

    def release(self) -> None:
        with self.cond:
            self.holding = False
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join()

    def metrics(self, trained: int) -> dict[str, float]:
        with self.cond:
            queued, busy = len(self.queue), int(self.busy)
            started, failed = self.started, self.failed
        in_flight = queued + busy
        if started != trained + in_flight + failed:
            raise RuntimeError(f"async conservation broken: started {started} != trained {trained} + in flight "
                               f"{in_flight} + failed {failed}")
        return {"async/started": float(started), "async/trained": float(trained), "async/in_flight": float(in_flight),
                "async/queued": float(queued), "async/dropped": 0.0,
                "async/generate_idle_s": self.idle["generate"], "async/update_idle_s": self.idle["update"]}

    def target(self, step: int) -> int:
        """The policy version that samples batch ``step``."""
        return max(0, step - self.k)

    def _raise(self) -> None:
        if self.error is not None:
            raise PipelineError(f"the async producer failed: {self.error!r}") from self.error

    # -- the producer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    start = time.perf_counter()
                    # a batch needs its version published; a checkpoint barrier holds the producer at step + k
                    while not self.stopping and (self.holding or self.target(self.next_step) not in self.snapshots):
                        self.cond.wait(0.5)
                    self.idle["generate"] += time.perf_counter() - start
                    if self.stopping:
                        return
                    step, version = self.next_step, self.target(self.next_step)
                    weights = self.snapshots[version]
                    self.busy = True
                    self.started += 1
                if self.dtype is not None and hasattr(self.engine, "set_dtype"):  # between batches: nothing running
                    self.engine.set_dtype(self.dtype)
                    self.dtype = None
                if self.engine.version != version:
                    load_policy_state(self.model, weights)
                    self.engine.load_weights(self.model)
                    self.engine.version = version
                batch = self.trainer.collect(step, self.cursor, self.engine)
                with self.cond:
                    self.cursor = batch.cursor
                    self.queue.append(batch)
                    self.next_step += 1
                    self.busy = False
                    self.cond.notify_all()
        except BaseException as e:  # surfaced to the trainer by take()/barrier()
            with self.cond:
                self.error = e
                self.failed += int(self.busy)
                self.busy = False
                self.cond.notify_all()
