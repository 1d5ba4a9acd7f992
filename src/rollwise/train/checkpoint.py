"""Checkpoints: safetensors weights + optimizer + scheduler + RNG states + trainer state.

A checkpoint directory ``checkpoints/step_000050/`` holds::

    model.safetensors   policy weights; tensors that share storage (tied input and output
                        embeddings) are stored once, the other names recorded in the
                        file's metadata as aliases and restored on load
    optimizer.pt        optimizer and LR-scheduler state dicts
    rng.pt              torch / python / numpy RNG states
    state.json          step, data cursor, counters (human-readable)
    generator.pt        the rollout strategy's state, if it has one (APRIL's carry-over
                        buffer, TreePO's entropy window)

Resuming loads all four, so the run continues exactly as the uninterrupted one would.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rollwise.config import ConfigError


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                    generator_state: dict | None = None) -> Path:
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"  # written in full, then renamed: a kill never leaves half a checkpoint
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights, aliases = unique_weights(model.state_dict())
    save_file(weights, str(tmp / "model.safetensors"), metadata={"aliases": json.dumps(aliases)})
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save(
        {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if generator_state is not None:
        torch.save(generator_state, tmp / "generator.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def unique_weights(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(one CPU copy per distinct storage, {alias: stored name}): tied embeddings are written once.

    Two names alias when they are views of the same storage with the same offset, shape and
    strides (a tied ``lm_head.weight`` is ``embed_tokens.weight``); a 7B model's 500M-parameter
    embedding is then not written twice.
    """
    stored: dict[tuple, str] = {}
    weights, aliases = {}, {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if key in stored:
            aliases[name] = stored[key]
            continue
        stored[key] = name
        weights[name] = tensor.detach().to("cpu", copy=True).contiguous()
    return weights, aliases


def load_weights(path: Path, model) -> None:
    """Load ``model.safetensors`` into ``model`` in place, aliases included (ties stay tied)."""
    file = str(path / "model.safetensors")
    with safe_open(file, "pt") as f:
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
    weights = load_file(file)
    for alias, name in aliases.items():
        weights[alias] = weights[name]
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or missing:
        raise ConfigError(f"checkpoint {path} does not match the model: missing {missing}, unexpected {unexpected} "
                          "(resume with the model the run started from)")


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob("step_*"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states in place; return the trainer state."""
    load_weights(path, model)
    opt = torch.load(path / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    return json.loads((path / "state.json").read_text())


def load_generator_state(path: Path) -> dict | None:
    """The rollout strategy's saved state (plain lists, dicts and tensors), or None."""
    file = path / "generator.pt"
    return torch.load(file, weights_only=True) if file.exists() else None
