"""``rollwise bench dist``: rollout workers on Ray against the in-process engine, side by side.

One SFT warm start of the demo's task (``arith``, ``tiny``) is shared by every arm. Each arm
samples and scores the same ``rounds`` batches of ``prompts_per_step`` x ``num_generations``
rollouts (``group`` strategy, the same seeds: every arm samples exactly the same tokens, so a
throughput ratio is a time ratio):

- ``in_process``: the trainer's own engine and reward functions, torch at 1 thread (measured
  first and again last; its throughput is the mean of both, so drift shows up as their gap);
- ``in_process_all``: the same on every core (what one process does with the machine);
- ``workers1`` / ``workers2``: ``WorkerPool`` with 1 and 2 Ray actors, 1 thread each
  (``worker_resources.num_cpus: 1``), scoring on the workers. One warm-up batch per pool
  (actor start-up, first weight load) is not timed.

Weight sync: for each preset in ``sync_presets`` a 2-worker pool takes ``syncs`` new versions
of the weights; per version it reports the driver's put in the object store, the slowest
worker's load, and their sum (what a training step pays, ``time/weight_sync``), with the
state dict's size.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
from pydantic import Field

from rollwise.bench.harness import load_settings, session, table, warm_start
from rollwise.config import StrictModel

ARMS = ("in_process", "in_process_all", "workers1", "workers2")


class DistBenchConfig(StrictModel):
    """Settings of ``rollwise bench dist`` (override with ``--set key=value``)."""

    rounds: int = Field(5, ge=1, description="timed batches per arm")
    prompts_per_step: int = Field(16, ge=1, description="prompts per batch")
    num_generations: int = Field(8, ge=1, description="rollouts per prompt")
    max_digits: int = Field(5, ge=1, description="arith operand digits (the demo's)")
    max_new_tokens: int = Field(96, ge=1, description="completion limit (the demo's)")
    sft_steps: int = Field(300, ge=0, description="SFT warm start of the tiny model (realistic completion lengths)")
    sync_presets: list[str] = Field(["tiny", "medium"], description="presets whose weight-sync time is measured")
    syncs: int = Field(5, ge=1, description="weight versions synced per preset")


def run_dist_bench(overrides: list[str], console) -> dict:
    cfg = load_settings(DistBenchConfig, overrides)
    from rollwise.dist import connect

    connect()
    with session() as tmp:
        out = {"settings": cfg.model_dump(), "cores": os.cpu_count(), "throughput": throughput(cfg, tmp, console)}
        out["weight_sync"] = [weight_sync(cfg, preset, tmp, console) for preset in cfg.sync_presets]
    _print(console, out)
    return out


def _sets(cfg: DistBenchConfig) -> list[str]:
    """The task and rollout lines of every run here (the demo's arith, ``group`` sampling)."""
    return ["task.name=arith", f"task.max_digits={cfg.max_digits}", "task.eval_size=8",
            f"rollout.max_new_tokens={cfg.max_new_tokens}", "rollout.strategy=group",
            f"rollout.num_generations={cfg.num_generations}", f"rollout.prompts_per_step={cfg.prompts_per_step}"]


def _trainer(cfg: DistBenchConfig, tmp: Path, name: str, *extra: str):
    """A trainer that takes no step: its engine, generator and pool are what the arms time."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    return Trainer(load_run_config(None, [f"output_dir={tmp}", f"name={name}", *_sets(cfg), "train.steps=0", *extra]))


def throughput(cfg: DistBenchConfig, tmp: Path, console) -> dict:
    """Every arm samples and scores the same batches with the same seeds (so the same tokens)."""
    warm = warm_start(tmp, "warm", [*_sets(cfg), f"sft.steps={cfg.sft_steps}", "model.threads=1"], console)
    trainer = _trainer(cfg, tmp, "bench", f"model.path={warm}", "model.threads=1")
    trainer.prepare()
    prompts = trainer.prompt_source().fresh(cfg.prompts_per_step * cfg.rounds)  # tokenized
    batches = [prompts[i * cfg.prompts_per_step:(i + 1) * cfg.prompts_per_step] for i in range(cfg.rounds)]
    runs = {}
    with console.status("in-process, 1 thread"):
        first = _in_process(trainer, batches, cfg.num_generations, 1)
    with console.status(f"in-process, {os.cpu_count()} threads"):
        runs["in_process_all"] = _in_process(trainer, batches, cfg.num_generations, os.cpu_count() or 1)
    for n in (1, 2):
        with console.status(f"{n} rollout worker(s)"):
            runs[f"workers{n}"] = _pooled(trainer, batches, cfg.num_generations, n)
    with console.status("in-process, 1 thread (again)"):
        last = _in_process(trainer, batches, cfg.num_generations, 1)
    trainer.close()
    runs["in_process"] = {"tokens": first["tokens"], "seconds": (first["seconds"] + last["seconds"]) / 2,
                          "first_seconds": first["seconds"], "last_seconds": last["seconds"]}
    base = runs["in_process"]["tokens"] / runs["in_process"]["seconds"]
    for arm in ARMS:
        r = runs[arm]
        r["tokens_per_second"] = r["tokens"] / r["seconds"]
        r["ratio"] = r["tokens_per_second"] / base
    runs["same_tokens"] = len({runs[a]["tokens"] for a in ARMS}) == 1
    return runs


def _in_process(trainer, batches: list[list], group: int, threads: int) -> dict:
    """The trainer's own engine and reward functions at ``threads`` torch threads (then back to 1)."""
    from rollwise.filter.rewards import score_groups

    torch.set_num_threads(threads)
    tokens, start = 0, time.perf_counter()
    for i, batch in enumerate(batches):
        before = trainer.engine.stats.decode_tokens
        groups, _ = trainer.generator.generate(trainer.engine, batch, [group] * len(batch), seed=1000 + i)
        score_groups(groups, trainer.reward_fns)
        tokens += trainer.engine.stats.decode_tokens - before
    torch.set_num_threads(1)
    return {"tokens": tokens, "seconds": time.perf_counter() - start}


def _pooled(trainer, batches: list[list], group: int, n: int) -> dict:
    """``n`` Ray rollout workers sampling and scoring the batches (their start-up not timed)."""
    from rollwise.dist import WorkerPool

    run_cfg = trainer.cfg.model_copy(update={"rollout": trainer.cfg.rollout.model_copy(update={"workers": n})})
    pool = WorkerPool(run_cfg, trainer.model)
    try:
        pool.generate(batches[0][:n], [1] * n, seed=0)  # every actor's start-up and first weight load: not timed
        tokens, start = 0, time.perf_counter()
        for i, batch in enumerate(batches):
            before = pool.stats.decode_tokens
            pool.generate(batch, [group] * len(batch), seed=1000 + i)
            tokens += pool.stats.decode_tokens - before
        return {"tokens": tokens, "seconds": time.perf_counter() - start}
    finally:
        pool.close()


def weight_sync(cfg: DistBenchConfig, preset: str, tmp: Path, console) -> dict:
    """A 2-worker pool takes ``syncs`` new versions of ``preset``'s weights: the put, the slowest load."""
    with console.status(f"weight sync, {preset}"):
        with _trainer(cfg, tmp, f"sync_{preset}", f"model.preset={preset}", "sft.steps=0", "model.threads=1",
                      "rollout.workers=2") as t:
            pool, model = t.pool, t.model
            prompt = t.prompt_source().fresh(1)
            pool.generate(prompt * 2, [1, 1], seed=0)  # both actors' start-up
            puts, loads = [], []
            for i in range(cfg.syncs):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-4)  # a new version
                pool.load_weights(model)
                start = time.perf_counter()
                pool.publish()
                puts.append(time.perf_counter() - start)
                _, metrics = pool.generate(prompt * 2, [1, 1], seed=i + 1)  # one prompt per worker
                loads.append(metrics["time/weight_sync"])  # ~ the slowest worker's load (the put was above)
            size = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    return {"preset": preset, "megabytes": size / 2**20, "put_s": statistics.mean(puts),
            "load_s": statistics.mean(loads), "sync_s": statistics.mean(puts) + statistics.mean(loads)}


def _print(console, out: dict) -> None:
    t = out["throughput"]
    console.print(table(f"rollout throughput (sample + score), {out['cores']} cores; same tokens in every arm: "
                        f"{t['same_tokens']}", ("arm", "tokens", "seconds", "tokens/s", "vs in-process (1 thread)"),
                        [[arm, str(t[arm]["tokens"]), f"{t[arm]['seconds']:.2f}", f"{t[arm]['tokens_per_second']:.0f}",
                          f"{t[arm]['ratio']:.2f}x"] for arm in ARMS]))
    ip = t["in_process"]
    console.print(f"in-process drift: first {ip['first_seconds']:.2f} s, last {ip['last_seconds']:.2f} s")
    console.print(table("weight sync per version (2 workers)",
                        ("preset", "MB", "put (driver)", "load (slowest worker)", "per step"),
                        [[w["preset"], f"{w['megabytes']:.1f}", f"{w['put_s'] * 1000:.1f} ms",
                          f"{w['load_s'] * 1000:.1f} ms", f"{w['sync_s'] * 1000:.1f} ms"] for w in out["weight_sync"]]))
