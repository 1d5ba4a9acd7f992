"""Dist: scale-out on Ray — rollout workers as actors, weights through the object store.

``rollout.workers: N`` (N > 0) starts N Ray actors (``dist/worker.py``), each with its own copy
of the policy, engine, rollout strategy and, by default, the reward functions and a sandbox.
The driver keeps everything else: the controller decides prompts and budgets, the policy
update runs in the driver, and ``WorkerPool`` (``dist/pool.py``) stands where the loop's
engine stands, in the synchronous loop and behind the async producer alike. ``ray`` is the
optional extra ``rollwise[ray]``; ``ray.init()`` joins the cluster at ``RAY_ADDRESS`` when it
is set, else starts a local one.

Modelled on the Ray layouts of verl, OpenRLHF and NeMo-RL (rollout workers as actors, a
weight broadcast per version). Departures: weights travel through Ray's object store (one
put per version, each worker loads it at its next shard), not NCCL — the GPU path (a
vLLM-backed engine behind the same contract, weights by NCCL broadcast) is described in the
README and not built until it can be tested on a GPU; the driver's controller sends whole
shards, not one request at a time.
"""

from rollwise.dist.pool import WorkerPool, balance, connect, merge_metrics

__all__ = ["WorkerPool", "balance", "connect", "merge_metrics"]
