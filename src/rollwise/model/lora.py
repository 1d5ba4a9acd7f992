"""LoRA adapters (peft): the policy is a frozen base plus trained low-rank updates.

``model.lora: {r, alpha, dropout, target_modules}`` wraps each targeted linear of the loaded
model in peft's ``lora.Linear`` (``peft.inject_adapter_in_model``: the model stays the same HF
class, so everything that reads ``model.config`` or ``model.model.layers`` keeps working) and
freezes every other parameter. A wrapped linear computes ``y = x Wᵀ + s·B(A(drop(x)))`` with
``s = alpha / r``; ``B`` starts at zero, so the run starts at the base model exactly.

What the rest of rollwise asks of a LoRA policy lives here, each as a function that is the
identity (or the full-model behaviour) without LoRA:

- ``policy_state`` / ``load_policy_state``: the tensors that make this policy differ from the
  base (the adapter; the whole state dict without LoRA). Checkpoints, the async producer and
  Ray workers move only these.
- ``AdapterDisabled``: the KL reference, the base with its adapters switched off (no copy).
- ``save_base``, ``merge_into_base``: the RL starting point and ``rollwise export --merged``.

The slot engine and the packed training forward read peft's layers themselves
(``rollwise.engine.llama``: merged weights for sampling, the factored form with gradients
for training). peft is imported only inside functions: it is the ``rollwise[lora]`` extra.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from pydantic import Field

from rollwise.config import ConfigError, StrictModel

ADAPTER_MARKS = (".lora_A.", ".lora_B.")  # peft's parameter names: ...q_proj.lora_A.default.weight
INSTALL = "pip install 'rollwise[lora]'"


class LoraConfig(StrictModel):
    r: int = Field(8, ge=1, description="adapter rank: A is [r, in], B is [out, r]")
    alpha: float = Field(16.0, gt=0, description="scaling numerator: the update is (alpha / r)·B·A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input while training "
                                                       "(never when sampling or scoring without gradient)")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], min_length=1,
        description="names of the linears that get an adapter (the last part of the module name); the "
                    "default is every projection of a Llama-family layer")


def _peft():
    try:
        import peft
    except ImportError:
        raise ConfigError(f"model.lora needs peft, which is not installed: {INSTALL}") from None
    return peft


def linear_names(model) -> list[str]:
    """The distinct last names of the model's linears (``nn.Linear``, and GPT-2's ``Conv1D``,
    which peft wraps too), the LM head aside (it is tied to the embedding in many models, and
    the slot engine reads it as a plain matrix)."""
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"}
    return sorted(names - {"lm_head"})


def check_targets(model, targets: list[str]) -> None:
    """Every ``model.lora.target_modules`` entry names a linear of ``model``, or a ConfigError saying which."""
    valid = linear_names(model)
    for name in targets:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"model.lora.target_modules: '{name}' is not a linear of this model{hint}; "
                              f"choose from {valid}")


def apply_lora(model, cfg: LoraConfig, seed: int = 0):
    """Wrap ``cfg.target_modules`` in LoRA adapters, in place; only the adapters stay trainable.

    A is drawn (peft's Kaiming init) under a forked RNG seeded by ``seed``: every process
    building this policy (a resumed run, a Ray worker, ``export``) gets the same adapter, and
    the global RNG is left as it was, so turning LoRA on does not shift the run's other draws.
    """
    peft = _peft()
    check_targets(model, cfg.target_modules)
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=list(cfg.target_modules), bias="none")
    device = next(model.parameters()).device  # peft puts each adapter on its base layer's device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = peft.inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter(name))
    return model


def is_adapter(name: str) -> bool:
    return any(mark in name for mark in ADAPTER_MARKS)


def lora_layers(model) -> list[torch.nn.Module]:
    """peft's LoRA-wrapped linears of ``model`` (empty without LoRA)."""
    return [m for m in model.modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")]


def has_lora(model) -> bool:
    return bool(lora_layers(model))


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """What the optimizer steps: the adapters under LoRA, every parameter in full fine-tuning."""
    return [p for p in model.parameters() if p.requires_grad]


def policy_state(model) -> dict[str, torch.Tensor]:
    """The tensors that make this policy what it is beyond its fixed base, by reference: the
    adapter weights under LoRA, the whole state dict otherwise."""
    state = model.state_dict()
    if not has_lora(model):
        return state
    return {n: t for n, t in state.items() if is_adapter(n)}


def load_policy_state(model, state: dict[str, torch.Tensor]) -> None:
    """Copy ``policy_state``'s tensors into ``model`` in place (the names must match exactly)."""
    if not has_lora(model):
        model.load_state_dict(state)
        return
    targets = policy_state(model)
    if set(state) != set(targets):
        missing, unexpected = sorted(set(targets) - set(state)), sorted(set(state) - set(targets))
        raise ValueError(f"adapter state does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.no_grad():
        for name, t in state.items():
            targets[name].copy_(t)


def copy_policy(model):
    """A deep copy of ``model`` for another engine (the async producer). Under LoRA the frozen
    base tensors are shared, not copied: only the adapters differ between the two, so the copy
    costs the adapter's memory, not a second model's."""
    if not has_lora(model):
        return copy.deepcopy(model)
    memo = {id(p): p for n, p in model.named_parameters() if not is_adapter(n)}
    memo |= {id(b): b for b in model.buffers()}
    return copy.deepcopy(model, memo)


@contextmanager
def adapters_disabled(model) -> Iterator[None]:
    """Inside, every LoRA layer computes its base linear alone (peft's ``enable_adapters(False)``);
    trainability flags are restored on exit (peft's toggle also switches them)."""
    layers = lora_layers(model)
    flags = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in flags:
            p.requires_grad_(flag)


class AdapterDisabled:
    """The KL reference of a LoRA policy: its own base, adapters off — the RL starting point
    (B starts at zero) without a second copy of the model. A ``Reference``
    (``rollwise.model.reference``)."""

    def __init__(self, model) -> None:
        self.model = model

    @contextmanager
    def module(self) -> Iterator[torch.nn.Module]:
        with adapters_disabled(self.model):
            yield self.model


def base_state_dict(model) -> dict[str, torch.Tensor]:
    """The base model's state dict under its plain HF names (``q_proj.base_layer.weight`` →
    ``q_proj.weight``), adapters left out."""
    return {n.replace(".base_layer.", "."): t for n, t in model.state_dict().items() if not is_adapter(n)}


def save_base(model, directory: Path) -> None:
    """``save_pretrained`` of the base model (without LoRA: of the model), loadable by plain transformers."""
    if has_lora(model):
        model.save_pretrained(directory, state_dict=base_state_dict(model))
    else:
        model.save_pretrained(directory)


@torch.no_grad()
def merge_into_base(model):
    """Fold every adapter into its base weight (W ← W + s·B·A) and put the plain linear back, in
    place: the result is the HF model class with no trace of peft, computing the same function."""
    for name, module in list(model.named_modules()):
        if not (hasattr(module, "base_layer") and hasattr(module, "lora_A")):
            continue
        base = module.base_layer
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                base.weight += module.get_delta_weight(adapter).to(base.weight.dtype)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, base)
    return model


def check_composition(cfg) -> None:
    """ConfigErrors for what LoRA does not compose with (``cfg`` is a ``RunConfig``)."""
    if cfg.model.lora is None:
        return
    if cfg.replay.method == "remix":
        raise ConfigError("replay.method=remix moves the KL reference to the current policy (reincarnation); with "
                          "model.lora the reference is the base with the adapter off, which cannot move — use "
                          "another replay.method or full fine-tuning (model.lora=null)")
    if cfg.sft.steps:
        raise ConfigError("sft.steps > 0 with model.lora: the warm start would be part of the adapter, so the KL "
                          "reference (adapter off) and the RL starting point would differ; run `rollwise sft` first "
                          "and point model.path at its output, or set sft.steps=0")
