"""Run-directory logging: ``metrics.jsonl``, ``samples.jsonl``, ``trees.jsonl``, ``evals.jsonl``
(each eval's greedy correctness per prompt), and the loggers of ``train.report_to`` (TensorBoard,
Weights & Biases) with the same metric names.

A resumed run continues the files of the run it resumes: every line logged after the
checkpoint's step is dropped first (it will be produced again), so the files of a run killed
and resumed equal those of the uninterrupted run line for line (``time/*`` values aside).
TensorBoard's event files cannot be cut that way; the writer is opened with ``purge_step`` so
TensorBoard discards the events after the checkpoint instead. A W&B run cannot be cut either:
a resumed run logs to a new W&B run (same name) from the checkpoint's step on.

Also here: the metrics a training step computes from its groups (``rollout_metrics``,
``staleness_metrics``) and the wall time of its phases (``Clock``).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from rollwise.config import ConfigError
from rollwise.types import RolloutGroup

LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # train.report_to name -> the package it needs


def check_loggers(names) -> list:
    """``train.report_to`` as given, once every name is a known logger whose package is installed.

    >>> check_loggers([])
    []
    """
    if isinstance(names, str):
        names = [names]
    for name in names if isinstance(names, (list, tuple)) else []:
        if name not in LOGGERS:
            close = difflib.get_close_matches(str(name), list(LOGGERS), n=1, cutoff=0.4)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown logger '{name}'{hint} (train.report_to knows {', '.join(LOGGERS)})")
        if importlib.util.find_spec(LOGGERS[name]) is None:
            raise ConfigError(f"{name} is not installed: pip install 'rollwise[{name}]' "
                              f"(or drop '{name}' from train.report_to)")
    return names


class MetricsLog:
    def __init__(self, run_dir: Path, resume_from_step: int | None = None, report_to: list[str] = (),
                 config: dict | None = None):
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.trees_path = run_dir / "trees.jsonl"
        self.evals_path = run_dir / "evals.jsonl"
        if resume_from_step is not None:
            for path in (self.path, self.samples_path, self.trees_path, self.evals_path):
                _truncate_after(path, resume_from_step)
        check_loggers(list(report_to))
        self._tb = self._wandb = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_from_step is None else resume_from_step + 1
            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
        if "wandb" in report_to:
            self._wandb = _open_wandb(run_dir, config, resume_from_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) and math.isfinite(v) else str(v))
                 for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        scalars = {k: v for k, v in clean.items() if isinstance(v, float)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        with self.samples_path.open("a") as f:
            for s in samples:
                f.write(json.dumps({"step": step, **s}) + "\n")

    def log_eval(self, step: int, prompt_ids: list[str], correct: list[bool]) -> None:
        """One eval's greedy correctness per prompt ('0'/'1' per prompt, in ``prompt_ids`` order): what a
        bench pairs prompt by prompt across runs (``rollwise.bench.stats``)."""
        with self.evals_path.open("a") as f:
            f.write(json.dumps({"step": step, "correct": "".join("1" if c else "0" for c in correct),
                                "prompt_ids": list(prompt_ids)}) + "\n")

    def log_tree(self, step: int, tree: dict) -> None:
        """One rollout tree (``tree_record``) for the run report's tree view."""
        with self.trees_path.open("a") as f:
            f.write(json.dumps({"step": step, **tree}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            import wandb

            self._wandb.finish()
            # finish() can return before the wandb-core service has written the run file (seen with
            # 0.31.0: an offline .wandb holding only its header); teardown waits for the service to exit
            wandb.teardown()
            self._wandb = None


def _open_wandb(run_dir: Path, config: dict | None, resume_from_step: int | None):
    """A W&B run writing under ``run_dir/wandb``: offline unless the user set ``WANDB_MODE`` (this
    library must not need a network; ``wandb sync run_dir/wandb/offline-run-*`` uploads it later)."""
    import wandb

    name = run_dir.name if resume_from_step is None else f"{run_dir.name} (resumed at step {resume_from_step})"
    return wandb.init(project=os.environ.get("WANDB_PROJECT", "rollwise"), name=name, dir=str(run_dir),
                      config=config or {}, mode=os.environ.get("WANDB_MODE") or "offline",
                      settings=wandb.Settings(console="off"))


def tree_record(group, decode) -> dict | None:
    """One tree group as plain data: each node's span as text, each leaf's path, reward and verdict.

    A node's tokens are read from any leaf through it (positions ``[start, end)`` of its completion).
    """
    tree = group.tree
    if tree is None:
        return None
    spans: dict[int, list[int]] = {}
    for r in group.rollouts:
        for nid in r.node_path or []:
            node = tree.nodes[nid]
            if nid not in spans:
                spans[nid] = r.completion_ids[node.start: node.end if node.end is not None else len(r.completion_ids)]
    nodes = [{"id": n.id, "parent": n.parent, "text": decode(spans.get(n.id, [])), "tokens": len(spans.get(n.id, []))}
             for n in tree.live_nodes()]
    leaves = [{"path": list(r.node_path or []), "reward": r.reward, "correct": r.correct,
               "reasons": r.reward_reasons, "finish_reason": r.finish_reason} for r in group.rollouts]
    return {"prompt": group.prompt.text, "answer": group.prompt.answer, "nodes": nodes, "leaves": leaves}


def _truncate_after(path: Path, step: int) -> None:
    """Keep the lines of a JSONL log whose ``step`` is at most ``step`` (a half-written last line goes too)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        if record.get("step", 0) <= step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(ln + "\n" for ln in kept))
    tmp.replace(path)


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def staleness_metrics(groups: list[RolloutGroup], version: int) -> dict[str, float]:
    """How many versions behind ``version`` (the policy being updated) the trained tokens were sampled."""
    ages = [version - v for g in groups for r in g.rollouts for v in r.versions]
    if not ages:
        return {}
    counts = np.bincount(np.asarray(ages, dtype=np.int64).clip(min=0))
    return {"staleness/mean": float(np.mean(ages)), "staleness/max": float(max(ages))} | {
        f"staleness/share_{k}": float(c) / len(ages) for k, c in enumerate(counts) if c}


class Clock:
    """Wall time of a step's phases: ``lap(name)`` closes the phase that ran since the last lap."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}": v for k, v in self.laps.items()} | {"time/step": time.perf_counter() - self.start}


def rollout_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    rollouts = [r for g in groups for r in g.rollouts]
    rewards = torch.tensor([r.reward for r in rollouts])
    lengths = [r.num_tokens for r in rollouts]
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rollouts) > 1 else 0.0,
        "train/pass_rate": sum(g.pass_rate for g in groups) / len(groups),
        "groups/trained": float(len(groups)),
        "rollouts/trained": float(len(rollouts)),
        # failed episodes (a harness or environment that failed): in the groups, without weight or statistics
        "episodes/failed": float(sum(r.failure is not None for r in rollouts)),
        "length/mean": sum(lengths) / len(lengths),
        "length/max": float(max(lengths)),
        "length/truncated": sum(r.finish_reason == "length" for r in rollouts) / len(rollouts),
        "tokens/in_rollouts": float(sum(lengths)),  # shared tree prefixes counted once per leaf
    }
