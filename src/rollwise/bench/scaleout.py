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
import tempfile
import time
from pathlib import Path

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.engine import _quiet_transformers
from rollwise.config import StrictModel, apply_overrides, validate

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
    cfg = validate(DistBenchConfig, apply_overrides({}, list(overrides)))
    from rollwise.dist import connect

    connect()
    threads = torch.get_num_threads()
    try:
        with _quiet_transformers(), tempfile.TemporaryDirectory() as tmp:
            out = {"settings": cfg.model_dump(), "cores": os.cpu_count(), "throughput": throughput(cfg, Path(tmp),
                                                                                                  console)}
            out["weight_sync"] = [weight_sync(cfg, preset, Path(tmp), console) for preset in cfg.sync_presets]
    finally:
        torch.set_num_threads(threads)
    _print(console, out)
    return out


def _trainer(cfg: DistBenchConfig, tmp: Path, name: str, *extra: str):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    return Trainer(load_run_config(None, [
        f"output_dir={tmp}", f"name={name}", "task.name=arith", f"task.max_digits={cfg.max_digits}",
        "task.eval_size=8", f"rollout.max_new_tokens={cfg.max_new_tokens}", "rollout.strategy=group",
        f"rollout.num_generations={cfg.num_generations}", f"rollout.prompts_per_step={cfg.prompts_per_step}",
        "train.steps=0", *extra]))


def throughput(cfg: DistBenchConfig, tmp: Path, console) -> dict:
    from rollwise.dist import WorkerPool
    from rollwise.filter.rewards import score_groups

    with console.status(f"SFT warm start ({cfg.sft_steps} steps)"):
        with _trainer(cfg, tmp, "warm", f"sft.steps={cfg.sft_steps}", "model.threads=1") as t:
            t.prepare()
    warm = t.run_dir / "init_model"
    trainer = _trainer(cfg, tmp, "bench", f"model.path={warm}", "model.threads=1")
    trainer.prepare()
    prompts = trainer.prompt_source().fresh(cfg.prompts_per_step * cfg.rounds)  # tokenized
    batches = [prompts[i * cfg.prompts_per_step:(i + 1) * cfg.prompts_per_step] for i in range(cfg.rounds)]
    budgets = [cfg.num_generations] * cfg.prompts_per_step

    def in_process(n_threads: int) -> dict:
        torch.set_num_threads(n_threads)
        tokens, start = 0, time.perf_counter()
        for i, batch in enumerate(batches):
            before = trainer.engine.stats.decode_tokens
            groups, _ = trainer.generator.generate(trainer.engine, batch, budgets, seed=1000 + i)
            score_groups(groups, trainer.reward_fns)
            tokens += trainer.engine.stats.decode_tokens - before
        torch.set_num_threads(1)
        return {"tokens": tokens, "seconds": time.perf_counter() - start}

    def pooled(n: int) -> dict:
        run_cfg = trainer.cfg.model_copy(update={"rollout": trainer.cfg.rollout.model_copy(update={"workers": n})})
        pool = WorkerPool(run_cfg, trainer.model)
        try:
            pool.generate(batches[0][:n], [1] * n, seed=0)  # every actor's start-up and first weight load: not timed
            tokens, start = 0, time.perf_counter()
            for i, batch in enumerate(batches):
                before = pool.stats.decode_tokens
                pool.generate(batch, budgets, seed=1000 + i)
                tokens += pool.stats.decode_tokens - before
            return {"tokens": tokens, "seconds": time.perf_counter() - start}
        finally:
            pool.close()

    runs = {}
    with console.status("in-process, 1 thread"):
        first = in_process(1)
    with console.status(f"in-process, {os.cpu_count()} threads"):
        runs["in_process_all"] = in_process(os.cpu_count() or 1)
    for n in (1, 2):
        with console.status(f"{n} rollout worker(s)"):
            runs[f"workers{n}"] = pooled(n)
    with console.status("in-process, 1 thread (again)"):
        last = in_process(1)
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


def weight_sync(cfg: DistBenchConfig, preset: str, tmp: Path, console) -> dict:
    from rollwise.dist import WorkerPool

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
    t = Table(title=f"rollout throughput (sample + score), {out['cores']} cores; same tokens in every arm: "
                    f"{out['throughput']['same_tokens']}")
    for col in ("arm", "tokens", "seconds", "tokens/s", "vs in-process (1 thread)"):
        t.add_column(col)
    for arm in ARMS:
        r = out["throughput"][arm]
        t.add_row(arm, str(r["tokens"]), f"{r['seconds']:.2f}", f"{r['tokens_per_second']:.0f}", f"{r['ratio']:.2f}x")
    console.print(t)
    ip = out["throughput"]["in_process"]
    console.print(f"in-process drift: first {ip['first_seconds']:.2f} s, last {ip['last_seconds']:.2f} s")
    s = Table(title="weight sync per version (2 workers)")
    for col in ("preset", "MB", "put (driver)", "load (slowest worker)", "per step"):
        s.add_column(col)
    for w in out["weight_sync"]:
        s.add_row(w["preset"], f"{w['megabytes']:.1f}", f"{w['put_s'] * 1000:.1f} ms", f"{w['load_s'] * 1000:.1f} ms",
                  f"{w['sync_s'] * 1000:.1f} ms")
    console.print(s)
