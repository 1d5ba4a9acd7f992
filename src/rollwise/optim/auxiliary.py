"""An extra loss term trained with the policy loss: an optimizer whose ``zero_grad`` leaves the
term's gradient in place of zeros, so every pass of the policy update steps on both.

``dph_rl``'s rehearsal of the initial policy's samples (``optim/dph.py``) and ``masa``'s
self-alignment of its meta predictions (``control/masa.py``) are such terms. They nest: the outer
term's ``zero_grad`` calls the inner one's, and ``metrics`` reports every term's mean value. A
term's forward runs under ``context``, the update's own precision (``optim.update.compute``: bf16
autocast when the update computes in bf16), its backward outside it, as the policy loss's.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch


class AuxiliaryTerm:
    """``optimizer`` with ``coef · loss()`` added to every pass's gradient; ``name``: its metric."""

    def __init__(self, optimizer, loss: Callable[[], torch.Tensor | None], coef: float, name: str,
                 context: Callable[[], AbstractContextManager] = nullcontext) -> None:
        self.optimizer, self.loss, self.coef, self.name, self.context = optimizer, loss, coef, name, context
        self.values: list[float] = []

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        if self.coef <= 0:
            return
        with self.context():
            value = self.loss()
        if value is not None:
            (self.coef * value).backward()
            self.values.append(float(value.detach()))

    def step(self, *args, **kwargs):
        return self.optimizer.step(*args, **kwargs)

    def metrics(self) -> dict[str, float]:
        inner = self.optimizer.metrics() if isinstance(self.optimizer, AuxiliaryTerm) else {}
        return inner | ({self.name: sum(self.values) / len(self.values)} if self.values else {})
