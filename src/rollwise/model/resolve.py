"""A run directory or one of its checkpoints wherever a model path is accepted (``model.path``,
``rollwise eval``, ``rollwise serve``): the run's trained policy, built in memory.

- ``runs/<name>`` (a directory with ``config.yaml`` and ``checkpoints/``) stands for the policy
  of its latest checkpoint; ``runs/<name>/checkpoints/step_N`` for that step's.
- A checkpoint holds trained weights only (``model.safetensors``, or ``adapter.safetensors``
  under ``model.lora``). The architecture and tokenizer come from the run's starting model
  (``init_model/``, or the directory ``init_model.json`` records); the checkpoint's weights are
  copied into it and a LoRA adapter is merged — the policy ``rollwise export`` writes, without
  writing it. The result is a plain model: every parameter trainable, no peft wrapper.
- A directory that is neither a Hugging Face model (``config.json``) nor a run nor a checkpoint,
  a run without a checkpoint, or a checkpoint outside its run is a ConfigError that says what was
  looked for (and ``rollwise export``, for a directory other tools load).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from rollwise.config import ConfigError
from rollwise.model.lora import LoraConfig, apply_lora, merge_into_base
from rollwise.model.weights import latest_checkpoint, load_weights, weights_file

LOOKED_FOR = ("config.json (a Hugging Face save_pretrained directory), config.yaml + checkpoints/ (a rollwise run "
              "directory) or model.safetensors + state.json (one of its checkpoints, checkpoints/step_N)")


@dataclass(frozen=True)
class RunPolicy:
    """A run's trained policy as stored: ``base`` (HF directory: architecture, tokenizer, starting
    weights), ``checkpoint`` (the trained weights), ``lora`` (the run's ``model.lora``, or None)."""

    run_dir: Path
    checkpoint: Path
    base: Path
    lora: dict | None

    def load_into(self, model, seed: int = 0):
        """``model`` (loaded from ``base``) with the checkpoint's weights: the adapter merged."""
        if self.lora is not None:
            model = apply_lora(model, LoraConfig.model_validate(self.lora), seed=seed)
        load_weights(self.checkpoint, model, weights_file(model))
        model = merge_into_base(model)
        for p in model.parameters():  # LoRA froze the base; the policy is trained whole unless asked otherwise
            p.requires_grad_(True)
        return model


def is_checkpoint(path: Path) -> bool:
    return (path / "state.json").is_file() and any((path / f).is_file()
                                                   for f in ("model.safetensors", "adapter.safetensors"))


def run_policy(path: str | Path) -> RunPolicy | None:
    """The run policy ``path`` names (a run directory or a checkpoint), None for any other path,
    or a ConfigError for a run that holds no policy to load."""
    p = Path(path)
    if not p.is_dir() or (p / "config.json").is_file():
        return None
    if is_checkpoint(p):
        run_dir, ckpt = p.parent.parent, p
        if p.parent.name != "checkpoints" or not (run_dir / "config.yaml").is_file():
            raise ConfigError(f"checkpoint '{p}' is not inside its run directory (runs/<name>/checkpoints/step_N): "
                              "its architecture and tokenizer are the run's starting model; point at the checkpoint "
                              "in its run, or make a model directory with `rollwise export RUN_DIR --merged OUT`")
    elif (p / "config.yaml").is_file():
        run_dir, ckpt = p, latest_checkpoint(p)
        if ckpt is None:
            raise ConfigError(f"run directory '{p}' has no checkpoint yet (checkpoints/step_N, written every "
                              "train.checkpoint_every steps and at the end of a run); its starting model is "
                              f"{starting_model(p)}")
    else:
        return None
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    return RunPolicy(run_dir, ckpt, starting_model(run_dir), (config.get("model") or {}).get("lora"))


def starting_model(run_dir: Path) -> Path:
    """The HF directory a run's RL started from: ``init_model/``, or the one ``init_model.json`` records."""
    record = run_dir / "init_model.json"
    path = Path(json.loads(record.read_text())["path"]) if record.is_file() else run_dir / "init_model"
    if not (path / "config.json").is_file():
        raise ConfigError(f"run directory '{run_dir}' has no starting model at {path} (its init_model/ or the "
                          "directory init_model.json records): the run's architecture and tokenizer are unknown")
    return path
