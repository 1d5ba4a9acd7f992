"""Checkpoints: safetensors weights + optimizer + scheduler + RNG states + trainer state.

A checkpoint directory ``checkpoints/step_000050/`` holds::

    model.safetensors   policy weights; tensors that share storage (tied input and output
                        embeddings) are stored once, the other names recorded in the
                        file's metadata as aliases and restored on load
    adapter.safetensors in its place under ``model.lora``: the LoRA adapter weights only (the
                        base is the run's fixed starting model, rebuilt from the config)
    optimizer.pt        optimizer and LR-scheduler state dicts
    rng.pt              torch / python / numpy RNG states
    state.json          step, data cursor, counters (human-readable)
    generator.pt        the rollout strategy's state, if it has one (APRIL's carry-over
                        buffer, TreePO's entropy window)
    controller.pt       the controller's state and its PromptStats (``control.method`` other
                        than ``none``)
    pipeline.pt         async: the batches generated ahead and not trained yet
    replay.pt           the replay method's buffer and counters (``replay.method`` other than ``none``)
    rewards.pt          reward functions' state across steps, if any keeps one (POW3R's smoothed
                        weights, Weaver's window, a judge's verdict cache)
    dph_pool.pt         ``dph_rl``'s pool of the initial policy's samples
    reference.safetensors  a reference model moved during the run (ReMix's reincarnation)

Resuming loads them all, so the run continues exactly as the uninterrupted one would.
``save_run`` and ``restore_run`` are what a ``Trainer`` saves and loads; the functions below
them read and write the files.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from rollwise.filter.rewards import load_state, state_of
from rollwise.model.lora import policy_state
# reading a checkpoint's weights lives in model/ (a run directory is accepted wherever a model is); names kept here
from rollwise.model.weights import latest_checkpoint, load_weights, tied_groups, weights_file  # noqa: F401
from rollwise.train import precision
from rollwise.train.state import TrainState


def save_run(trainer, queued: list | None) -> Path:
    """Save everything ``trainer`` (a ``Trainer``) needs to resume at its current step, atomically;
    ``queued``: async batches generated ahead and not trained yet."""
    t, cfg = trainer, trainer.cfg
    control = None
    if cfg.control.method != "none":  # the run without control keeps its checkpoint layout
        control = {"controller": t.controller.state_dict(), "stats": t.stats.state_dict()}
    if getattr(t, "value_probe", None) is not None:  # poise: the value probes and their buffers
        control = {**(control or {}), "value_probe": t.value_probe.state_dict()}
    generator = t.pool.generator_state() if t.pool is not None else t.generator.state_dict()  # workers: theirs
    rewards = [state_of(f.fn) for f in reward_holders(t)]
    extras = {"rewards": rewards if any(r is not None for r in rewards) else None,
              "dph_pool": {"pool": t.dph_pool} if t.dph_pool else None}
    return save_checkpoint(t.run_dir, t.state.step, t.model, t.optimizer, t.scheduler, asdict(t.state),
                           cfg.train.keep_checkpoints, generator or None, control, queued,
                           t.replay.state_dict() if cfg.replay.method != "none" else None,
                           t.ref_model if t.state.reference_moved_at is not None else None, extras)


def reward_holders(trainer) -> list:
    """The run's reward functions whose state a checkpoint keeps: the training rewards, and the eval
    judge when it is none of them."""
    fns = list(trainer.reward_fns)
    if all(f.fn is not trainer.judge.fn for f in fns):
        fns.append(trainer.judge)
    return fns


def restore_run(trainer, path: Path) -> None:
    """Load checkpoint ``path`` into ``trainer``: weights (into its engine and rollout workers too,
    at the checkpoint's policy version), optimizer, RNG, state, the generator's, controller's and
    replay method's state, and the async batches it held (``trainer.queued``). A moved reference
    model is loaded by ``load_reference`` once the reference exists."""
    t = trainer
    t.state = TrainState(**load_checkpoint(path, t.model, t.optimizer, t.scheduler))
    precision.keep_start(t)  # the dtypes the run started with, before the engine takes the weights
    t.engine.load_weights(t.model)
    t.engine.version = t.state.step  # a token's version = optimizer steps before it was sampled
    if t.pool is not None:
        t.pool.load_weights(t.model)
        t.pool.version = t.state.step
        t.pool.load_generator_state(load_generator_state(path) or {})
    else:
        t.generator.load_state_dict(load_generator_state(path) or {})
    control = load_control_state(path) or {}
    t.controller.load_state_dict(control.get("controller", {}))
    t.stats.load_state_dict(control.get("stats", {}))
    if getattr(t, "value_probe", None) is not None:
        t.value_probe.load_state_dict(control.get("value_probe", {}))
    t.queued = load_pipeline_state(path)
    t.replay.load_state_dict(load_replay_state(path))
    for f, state in zip(reward_holders(t), load_extra(path, "rewards") or []):
        load_state(f.fn, state)
    t.dph_pool = (load_extra(path, "dph_pool") or {}).get("pool", [])


def save_checkpoint(run_dir: Path, step: int, model, optimizer, scheduler, state: dict, keep: int,
                    generator_state: dict | None = None, control_state: dict | None = None,
                    queued: list | None = None, replay_state: dict | None = None, reference=None,
                    extras: dict[str, object] | None = None) -> Path:
    """Write checkpoint ``step`` atomically; ``extras``: more state, ``NAME.pt`` per entry (None: no file)."""
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"  # written in full, then renamed: a kill never leaves half a checkpoint
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights, aliases = unique_weights(policy_state(model))  # model.lora: the adapter alone
    save_file(weights, str(tmp / weights_file(model)), metadata={"aliases": json.dumps(aliases)})
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")
    torch.save(
        {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if generator_state is not None:
        torch.save(generator_state, tmp / "generator.pt")
    if control_state is not None:
        torch.save(control_state, tmp / "controller.pt")
    if queued is not None:  # async: scored batches generated ahead, not trained yet
        torch.save({"queued": queued}, tmp / "pipeline.pt")
    if replay_state is not None:  # the replay buffer's groups and the method's counters
        torch.save(replay_state, tmp / "replay.pt")
    for name, extra in (extras or {}).items():
        if extra is not None:
            torch.save(extra, tmp / f"{name}.pt")
    if reference is not None:  # a reference model moved during the run (ReMix's reincarnation)
        weights, aliases = unique_weights(reference.state_dict())
        save_file(weights, str(tmp / "reference.safetensors"), metadata={"aliases": json.dumps(aliases)})
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def unique_weights(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(one tensor per distinct storage, {alias: stored name}): tied embeddings are written once.

    Two names alias when they are views of the same storage with the same offset, shape and
    strides (a tied ``lm_head.weight`` is ``embed_tokens.weight``); a 7B model's 500M-parameter
    embedding is then not written twice. CPU tensors are handed to safetensors as they are
    (it writes from their memory), not copied: a copy would hold a second model in RAM while
    the checkpoint is written. Only a view overlapping an already stored one is copied, since
    safetensors refuses tensors that share memory.
    """
    weights, aliases, seen = {}, {}, set()
    for first, *others in tied_groups(state):
        tensor = state[first].detach()
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        tensor = tensor.to("cpu")
        weights[first] = tensor.clone(memory_format=torch.contiguous_format) if storage in seen else tensor.contiguous()
        seen.add(storage)
        aliases.update(dict.fromkeys(others, first))
    return weights, aliases


def load_reference(path: Path, model) -> bool:
    """Load a checkpoint's moved reference model (``reference.safetensors``) into ``model``; False if none."""
    if not (path / "reference.safetensors").exists():
        return False
    load_weights(path, model, "reference.safetensors")
    return True


def load_checkpoint(path: Path, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states in place; return the trainer state."""
    load_weights(path, model, weights_file(model))
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


def load_pipeline_state(path: Path) -> list:
    """The async batches a checkpoint holds (``ScoredBatch`` records, generated but not trained), or []."""
    file = path / "pipeline.pt"
    return torch.load(file, weights_only=False)["queued"] if file.exists() else []


def load_replay_state(path: Path) -> dict:
    """The replay method's saved state (``replay.pt``), or {}."""
    file = path / "replay.pt"
    return torch.load(file, weights_only=False) if file.exists() else {}


def load_extra(path: Path, name: str):
    """A checkpoint's ``NAME.pt`` written from ``save_checkpoint``'s ``extras``, or None."""
    file = path / f"{name}.pt"
    return torch.load(file, weights_only=False) if file.exists() else None


def load_control_state(path: Path) -> dict | None:
    """The controller's and PromptStats' saved state (``{"controller": ..., "stats": ...}``), or None."""
    file = path / "controller.pt"
    return torch.load(file, weights_only=True) if file.exists() else None
