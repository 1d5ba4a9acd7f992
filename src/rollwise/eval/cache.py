"""The eval of a run's starting weights, computed once for every run that starts from them.

A ledger's runs all start from one model and are graded on one eval set, so the eval at step 0
is one computation repeated in every run (on SmolLM2 and 1,000 prompts, ~5 minutes of a
~45-minute run). With ``train.eval_cache: DIR`` a run keeps that eval in ``DIR`` and a run with
the same key reads it back instead of computing it. The key is everything the result is a
function of: a digest of the weights as the engine holds them (after any cast, adapter or
conversion), the engine's dtype, the eval prompts' token ids and answers, the task and reward
settings (the judge), the eval's generation settings, and the machine (CPU model and flags,
torch version: another ISA may break a greedy tie the other way). Only the start is cached: every
later eval is of weights no other run has.

Episodic tasks are never cached (an environment may hold state between episodes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch

from rollwise.eval.accuracy import EvalResult


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter and buffer, by name, as bytes (dtype and shape included)."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def eval_key(weights: str, parts: dict) -> str:
    """The cache key of an eval: the weights' digest and every other input (``parts``, JSON-able)."""
    return hashlib.sha256(json.dumps({"weights": weights, **parts}, sort_keys=True, default=str).encode()).hexdigest()


def start_key(model: torch.nn.Module, engine, cfg, eval_prompts, stop_ids) -> str:
    """The key of a run's start eval: the weights as the engine holds them, the engine, the eval
    prompts, the judge (task, rewards, sandbox), the generation settings and the machine."""
    from rollwise.hardware import cpu_record

    tc, ro = cfg.train, cfg.rollout
    sampled = {"samples": tc.eval_samples, "temperature": ro.temperature, "seed": cfg.seed} if tc.eval_samples else {}
    return eval_key(weights_digest(model), {
        "engine": [type(engine).__name__, str(engine.dtype), ro.model_dump(mode="json"), torch.get_num_threads()],
        "prompts": [[p.id, p.token_ids, p.answer] for p in eval_prompts],
        "judge": [cfg.task.model_dump(mode="json"), cfg.rewards and [r.model_dump(mode="json") for r in cfg.rewards],
                  cfg.sandbox.model_dump(mode="json")],
        "generation": [list(stop_ids), tc.log_samples, sampled], "machine": cpu_record()})


def load(directory: str | Path, key: str) -> EvalResult | None:
    """The cached eval with ``key``, or None (absent or unreadable: computed again)."""
    path = Path(directory) / f"{key}.json"
    try:
        fields = json.loads(path.read_text())
        for k in ("pass_at", "maj_at"):  # JSON keys are strings; k is an int
            fields[k] = {int(n): v for n, v in fields[k].items()}
        return EvalResult(**fields)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def store(directory: str | Path, key: str, result: EvalResult) -> EvalResult:
    """Keep ``result`` under ``key`` and return it (written whole, then renamed: a killed run never
    leaves half a file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{key}.json.tmp"
    tmp.write_text(json.dumps(asdict(result)))
    tmp.replace(directory / f"{key}.json")
    return result
