"""The KL reference policy, as the update reads it: something that lends a module for a no-grad forward.

Full fine-tuning keeps a frozen copy of the RL starting weights (``FrozenCopy``); a LoRA policy
is its own reference with the adapters switched off (``rollwise.model.lora.AdapterDisabled``),
so no second model is held. The update only asks ``with reference.module() as m:`` and scores
the batch under ``m``; which of the two it is stays with whoever built it (the trainer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

import torch


class Reference(Protocol):
    def module(self) -> AbstractContextManager[torch.nn.Module]:
        """The reference as a module, valid inside the ``with`` block."""
        ...


class FrozenCopy:
    """A separate frozen model (full fine-tuning: the RL starting weights, or ReMix's moved reference)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @contextmanager
    def module(self) -> Iterator[torch.nn.Module]:
        yield self.model


def as_reference(ref) -> Reference:
    """A ``Reference`` from a reference or a plain module (a module is its own frozen reference)."""
    return FrozenCopy(ref) if isinstance(ref, torch.nn.Module) else ref
