"""Reading a checkpoint's trained weights (``checkpoints/step_N/model.safetensors``, or
``adapter.safetensors`` under LoRA) into a model, in place, tensor by tensor.

Here rather than in ``train/checkpoint.py`` (which writes checkpoints and restores a whole run)
because a run directory or checkpoint is accepted wherever a model is (``model/resolve.py``), and
``model/`` imports nothing of ``train/``. Tensors sharing storage (tied embeddings) are stored
once, the other names recorded as aliases in the file's metadata (``tied_groups``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from rollwise.config import ConfigError
from rollwise.model.lora import has_lora, policy_state


def weights_file(model) -> str:
    """The checkpoint file holding ``model``'s trained weights: the adapter's under LoRA."""
    return "adapter.safetensors" if has_lora(model) else "model.safetensors"


def tied_groups(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """The state dict's names grouped by the tensor they name: ``[["model.embed_tokens.weight",
    "lm_head.weight"], ["model.norm.weight"], ...]`` for a tied model, in state-dict order."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def load_weights(path: Path, model, name: str = "model.safetensors") -> None:
    """Copy ``model.safetensors`` into ``model``'s tensors in place, one tensor at a time.

    In place, ties hold by construction: a tied ``lm_head.weight`` is the embedding, filled
    once from the stored name (or from both names of a checkpoint written before aliases,
    when they are equal). Tensor by tensor, a resume never holds a second copy of the model.
    A checkpoint that does not fit the model (names, shapes, or two different tensors where
    the model has one) is a ConfigError naming what differs.
    """
    targets = model.state_dict() if name == "reference.safetensors" else policy_state(model)
    if not (path / name).exists():
        other = ({"adapter.safetensors", "model.safetensors"} - {name}).pop()
        used = "null" if name == "adapter.safetensors" else "set"
        hint = f" but has {other}: the run used model.lora={used}" if (path / other).exists() else ""
        raise ConfigError(f"checkpoint {path} has no {name}{hint} (resume with the run's own config)")
    with safe_open(str(path / name), "pt") as f:
        stored = set(f.keys())
        aliases = json.loads((f.metadata() or {}).get("aliases", "{}"))
        source = {n: n for n in stored} | {a: n for a, n in aliases.items() if n in stored}
        missing, unexpected = sorted(set(targets) - set(source)), sorted(set(source) - set(targets))
        shapes = {n: list(f.get_slice(source[n]).get_shape()) for n in targets if n in source}
        wrong = [f"{n} {shapes[n]} vs {list(targets[n].shape)}" for n in shapes if shapes[n] != list(targets[n].shape)]
        if missing or unexpected or wrong:
            raise ConfigError(f"checkpoint {path} does not match the model: missing {missing}, "
                              f"unexpected {unexpected}, "
                              f"shapes {wrong} (resume with the model the run started from)")
        with torch.no_grad():
            for names in tied_groups(targets):
                first, *others = sorted({source[n] for n in names})
                tensor = f.get_tensor(first)
                if any(not torch.equal(tensor, f.get_tensor(other)) for other in others):
                    raise ConfigError(f"checkpoint {path} stores {[first, *others]} as different tensors, but the "
                                      "model ties them (resume with the model the run started from)")
                targets[names[0]].copy_(tensor)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob("step_*"))
    return found[-1] if found else None
