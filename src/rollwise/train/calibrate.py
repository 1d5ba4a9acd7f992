"""``rollwise calibrate``: the starting model's pass@k on the first N train prompts.

Each prompt gets k completions sampled as training samples them (``rollout.temperature``,
``rollout.max_new_tokens``, the model's chat template), scored by the run's judge; the count of
correct ones sorts it into never / mixed / always (``rollwise.tasks.selection``), which
``task.select`` trains on. The calibration records what it holds for — the task settings, the
data seed, the model, k and the sampling settings — so a run on other settings refuses it.

Resumable: finished prompts are appended to ``<out>.partial.jsonl`` chunk by chunk; a rerun with
the same settings continues after the last one and the JSON is written at the end. Prompt ``i``'s
samples are seeded from ``(seed, i)``, so a resumed calibration equals an uninterrupted one.
Nothing is overwritten without ``overwrite``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from rollwise.config import ConfigError
from rollwise.engine.engine import Request
from rollwise.filter.rewards import score_groups
from rollwise.generate.group import to_rollout
from rollwise.hardware import cpu_record
from rollwise.report.runs import read_jsonl
from rollwise.tasks.selection import split, task_fingerprint
from rollwise.types import RolloutGroup


def header(cfg, prompts: int, k: int) -> dict:
    """What a calibration holds for (a partial file resumes only under the same)."""
    if not hasattr(cfg.task, "select"):
        raise ConfigError(f"rollwise calibrate: task.name {cfg.task.name!r} has no task.select; calibration is for "
                          "tasks that can train on it (reasoning_gym)")
    return {"task": task_fingerprint(cfg.task), "data_seed": cfg.task.data_seed_for(cfg.seed), "seed": cfg.seed,
            "model": cfg.model.path, "k": k, "prompts_asked": prompts, "temperature": cfg.rollout.temperature,
            "max_new_tokens": cfg.rollout.max_new_tokens}


def _read_partial(path: Path, head: dict) -> list[dict]:
    """The prompts a killed calibration finished (a line cut by the kill dropped), under its header."""
    if not path.exists():
        return []
    records = read_jsonl(path)
    if not records or records[0] != head:
        raise ConfigError(f"rollwise calibrate: {path} holds a calibration with other settings; pass another --out "
                          "or remove it yourself")
    return records[1:]


def sample_counts(trainer, indices: list[int], k: int) -> list[dict]:
    """k sampled completions for each train prompt in ``indices``: one row per prompt with its correct count."""
    prompts = [trainer.tokenize(trainer.task.train.get(i)) for i in indices]
    base = trainer.sampling
    requests = [Request(p.token_ids, replace(base, seed=(trainer.cfg.seed * 1_000_003 + i) * 97 + j))
                for p, i in zip(prompts, indices) for j in range(k)]
    done = trainer.engine.generate(requests)
    groups = [RolloutGroup(p, [to_rollout(p, c, trainer.decode) for c in done[n * k:(n + 1) * k]])
              for n, p in enumerate(prompts)]
    score_groups(groups, [trainer.judge])
    return [{"index": i, "id": g.prompt.id, "dataset": g.prompt.columns.get("dataset"), "text": g.prompt.text,
             "correct": g.num_correct, "tokens": sum(r.num_tokens for r in g.rollouts)}
            for i, g in zip(indices, groups)]


def calibrate(cfg, out: Path, prompts: int, k: int, chunk: int = 32, overwrite: bool = False,
              on_chunk=None) -> dict:
    """Calibrate ``prompts`` train prompts of ``cfg``'s task (``task.select`` ignored); write ``out``."""
    from rollwise.train.loop import Trainer

    if out.exists() and not overwrite:
        raise ConfigError(f"rollwise calibrate: {out} exists; pass --overwrite to replace it")
    cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"select": None}),
                                 "sft": cfg.sft.model_copy(update={"steps": 0})})
    head = header(cfg, prompts, k)
    partial = out.with_name(out.name + ".partial.jsonl")
    rows = _read_partial(partial, head)
    if not rows:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps(head) + "\n")
    start = time.process_time()
    with Trainer(cfg) as trainer:
        for lo in range(len(rows), prompts, chunk):
            new = sample_counts(trainer, list(range(lo, min(prompts, lo + chunk))), k)
            with partial.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
            rows += new
            if on_chunk is not None:
                on_chunk(len(rows), prompts)
    record = head | {"split": split(rows, k), "cpu": cpu_record(), "cpu_seconds_this_session":
                     round(time.process_time() - start, 1), "prompts": rows}
    out.write_text(json.dumps(record, indent=1))
    partial.unlink()  # ours, now folded into out
    return record
