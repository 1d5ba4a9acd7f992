"""Engine: token generation only (batched sampling with a KV cache, fork, pause/resume).

``make_engine`` picks the implementation: the slot engine (continuous batching, fork,
pause/resume, its own Llama-family forward) for the model types it supports, else the v1
engine, which runs any Hugging Face causal LM through ``model(...)``.

The contract both keep, and a new backend implements, is written down in
``engine/protocol.py``: ``TokenEngine`` (submit/step/run_until/generate/load_weights, the v1
engine) and ``BranchingEngine`` (peek/fork/pause/resume/abort/keep_prefixes besides, the slot
engine).
"""

from __future__ import annotations

import logging
from typing import Literal

log = logging.getLogger(__name__)

EngineKind = Literal["auto", "slots", "v1"]


def make_engine(model, *, pad_token_id: int, max_batch_size: int, seed: int, kind: EngineKind = "auto",
                dtype=None):
    """``dtype`` (a ``torch.dtype``, None = the model's own): the precision the engine samples in —
    another than the model's gives the engine its own cast copy of the weights, refreshed at every
    ``load_weights`` (``rollout.engine_dtype``; the trainer keeps its fp32 masters)."""
    from rollwise.engine.engine import Engine
    from rollwise.engine.llama import UnsupportedModelError
    from rollwise.engine.slots import SlotEngine

    common = {"pad_token_id": pad_token_id, "max_batch_size": max_batch_size, "seed": seed, "dtype": dtype}
    if kind == "v1":
        return Engine(model, **common)
    try:
        return SlotEngine(model, **common)
    except UnsupportedModelError as err:
        if kind == "slots":
            raise
        log.warning("slot engine unavailable (%s); using the v1 engine", err)
        return Engine(model, **common)
