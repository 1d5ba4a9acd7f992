"""The engine's sampling precision (``rollout.engine_dtype``), the guard on the mismatch it makes,
and the update's compute dtype (``optim.compute_dtype``).

The trainer keeps fp32 master weights; the engine samples from its own copy in the chosen
precision, refreshed at every ``load_weights`` (``rollwise.engine``). ``auto`` picks, once, when
the trainer is built (``choose``):

- on CUDA: bf16 where ``torch.cuda.is_bf16_supported()`` (untested here), else fp32;
- on a CPU: bf16 only where the CPU has native bf16 (AVX-512 BF16 or AMX BF16,
  ``rollwise.hardware.native_bf16``) AND the one-off micro-benchmark at the model's own shapes
  says bf16's ``F.linear`` is at least ``MIN_SPEEDUP`` times as fast as fp32's
  (``hardware.bf16_speedup``, cached per machine); else fp32 — on an AVX2-only CPU always fp32,
  and nothing changes;
- a policy loaded in another dtype than fp32 (``model.dtype``) samples in its own dtype.

The mismatch bound is checked while training (``MismatchGuard``): each step's
``mismatch/kl_k3`` (k3 KL(behaviour ‖ trainer) per sampled token, ``optim/correction.py``) is
compared with ``rollout.mismatch_kl_bound``; past it the run warns once and, with ``auto``,
falls back to fp32 (the engine's copy re-cast; ``mismatch/fallback`` = 1 from that step on).
An explicit ``bfloat16`` only warns: the recipe asked for it.

The update computes in ``optim.compute_dtype`` (``choose_update``): ``auto`` follows the same rule
as the engine's (bf16 on CUDA with bf16, or on a CPU with native bf16 whose benchmark — the same
cached measurement — finds it faster; else fp32), and bf16 means autocast around the update's
forwards with fp32 master weights (``rollwise.optim.update``). A policy loaded in another dtype
than fp32 (``model.dtype``) trains in it whatever the choice: its weights are the masters.

The correction (``objective.tis_mode = token_truncate``, as for stale tokens) is filled at
config time where the engine may sample below fp32 (``lower_precision_source``): ``bfloat16``,
or ``auto`` on a CPU with native bf16 or a CUDA device — before the benchmark, so on such a
machine a run whose benchmark picks fp32 still weights by the (≈ 1) truncated ratio.
"""

from __future__ import annotations

import logging

import torch

from rollwise import hardware

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MIN_SPEEDUP = 1.1  # bf16 must beat fp32 by this ratio at the model's shapes (a tie is not worth the mismatch)


def choose(choice: str, model, info: hardware.CpuInfo | None = None, speedup=None,
           field: str = "rollout.engine_dtype") -> tuple[torch.dtype, str]:
    """The engine's dtype for ``rollout.engine_dtype = choice`` (``field``) and why. ``info`` and
    ``speedup`` (``Shapes -> fp32 time / bf16 time``) replace the detection and the benchmark (tests)."""
    if choice != "auto":
        return DTYPES[choice], f"{field}={choice}"
    if model.dtype != torch.float32:
        return model.dtype, f"the policy's own dtype ({model.dtype}, model.dtype)"
    if next(model.parameters()).device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: CUDA with bf16"
        return torch.float32, "auto: CUDA without bf16"
    info = info or hardware.cpu_info()
    if not hardware.native_bf16(info):
        return torch.float32, f"auto: {info.model} has no native bf16 (avx512_bf16 or amx_bf16)"
    shapes = hardware.Shapes.of(model)
    ratio = speedup(shapes) if speedup is not None else hardware.bf16_speedup(shapes, info)
    if ratio < MIN_SPEEDUP:
        return torch.float32, f"auto: bf16 F.linear only {ratio:.2f}x fp32 at the model's shapes on {info.model}"
    return torch.bfloat16, f"auto: native bf16 on {info.model}, F.linear {ratio:.2f}x fp32 at the model's shapes"


def choose_update(choice: str, model, info: hardware.CpuInfo | None = None,
                  speedup=None) -> tuple[torch.dtype, str]:
    """The update's compute dtype for ``optim.compute_dtype = choice`` and why: ``choose``'s rule,
    except that a policy loaded below fp32 always trains in its own dtype (no fp32 masters to keep)."""
    if model.dtype != torch.float32:
        return model.dtype, (f"the policy's own dtype ({_name(model.dtype)}, model.dtype): its weights train in it "
                             f"(optim.compute_dtype={choice} does not apply)")
    return choose(choice, model, info, speedup, field="optim.compute_dtype")


def start_note(engine: tuple[torch.dtype, str], update: tuple[torch.dtype, str]) -> None:
    """Log, once as a run starts, the precision it samples and updates in, and why."""
    log.info("the engine samples in %s (%s); the update computes in %s (%s)", _name(engine[0]), engine[1],
             _name(update[0]), update[1])


def lower_precision_source(data: dict) -> str | None:
    """Why the engine may sample below fp32 (``rollout.engine_dtype`` as the raw config sets it), or
    None: the config-time condition for the default correction."""
    rollout = data.get("rollout")
    raw = rollout.get("engine_dtype", "auto") if isinstance(rollout, dict) else getattr(rollout, "engine_dtype", "auto")
    if raw == "bfloat16":
        return "rollout.engine_dtype=bfloat16"
    if raw != "auto":
        return None
    model = data.get("model")
    model = model if isinstance(model, dict) else (model.model_dump() if model is not None else {})
    if model.get("dtype", "float32") != "float32":
        return None  # auto samples in the policy's own dtype: no gap between engine and trainer precision
    device = str(model.get("device", "auto"))
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return "rollout.engine_dtype=auto on CUDA"
    if hardware.native_bf16(hardware.cpu_info()):
        return "rollout.engine_dtype=auto on a CPU with native bf16"
    return None


class MismatchGuard:
    """Watches each step's ``mismatch/kl_k3`` against the bound: warns once past it and, when the
    dtype was chosen by ``auto``, makes the engines sample in fp32 from then on."""

    def __init__(self, choice: str, dtype: torch.dtype, bound: float):
        self.choice, self.dtype, self.bound = choice, dtype, bound
        self.fell_back = False
        self.warned = False

    def check(self, metrics: dict, engines) -> dict[str, float]:
        """Metrics to log for this step; re-casts ``engines`` (those with ``set_dtype``) on a fallback."""
        kl = metrics.get("mismatch/kl_k3")
        out = {"mismatch/bound_exceeded": 0.0}
        if kl is not None and kl > self.bound and self.dtype != torch.float32:
            out["mismatch/bound_exceeded"] = 1.0
            if not self.warned:
                action = "falling back to fp32 sampling (rollout.engine_dtype=auto)" if self.choice == "auto" else \
                    "set rollout.engine_dtype=float32 (or auto) to sample in fp32"
                log.warning("the engine's %s sampling is %.4f nats/token (k3 KL, behaviour vs trainer) from the "
                            "trainer's policy, past rollout.mismatch_kl_bound=%g: %s", _name(self.dtype), kl,
                            self.bound, action)
                self.warned = True
            if self.choice == "auto":
                self.fall_back(engines)
        out["mismatch/fallback"] = float(self.fell_back)
        return out

    def fall_back(self, engines) -> None:
        self.dtype, self.fell_back = torch.float32, True
        for engine in engines:
            if engine is not None and hasattr(engine, "set_dtype"):
                engine.set_dtype(torch.float32)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def start_record(engine_dtype: torch.dtype, compute_dtype: torch.dtype) -> dict[str, str]:
    """What a run's precision keys resolved to at its start (``TrainState.precision``)."""
    return {"rollout.engine_dtype": _name(engine_dtype), "optim.compute_dtype": _name(compute_dtype)}


def auto_record(model) -> dict[str, str]:
    """What ``auto`` resolves the precision keys to on this machine (a checkpoint written before runs
    recorded their precision is judged as if it had started here)."""
    return start_record(choose("auto", model)[0], choose_update("auto", model)[0])


def keep_start(trainer) -> None:
    """A resumed run computes in the precisions it started with (``TrainState.precision``), not
    in what ``auto`` would choose on the machine it resumes on: a run begun in fp32 on an AVX2
    machine stays fp32 on a bf16 one (and the reverse), with a warning naming both. A checkpoint
    written before runs recorded their precision gets this session's from now on."""
    t = trainer
    here = start_record(t.engine_dtype, t.compute_dtype)
    if t.state.precision is None:
        t.state.precision = here
        return
    engine, compute = (getattr(torch, t.state.precision[k]) for k in ("rollout.engine_dtype", "optim.compute_dtype"))
    if engine != t.engine_dtype:
        log.warning("resuming in the precision the run started with: the engine samples in %s (here %s would: %s)",
                    _name(engine), _name(t.engine_dtype), t.engine_dtype_reason)
        t.engine_dtype, t.engine_dtype_reason = engine, (f"the run's start precision (resumed; here: "
                                                        f"{t.engine_dtype_reason})")
        t.guard.dtype = engine
        for e in (t.engine, t.pool):
            if e is not None and hasattr(e, "set_dtype"):
                e.set_dtype(engine)
    if compute != t.compute_dtype:
        log.warning("resuming in the precision the run started with: the update computes in %s (here %s would: %s)",
                    _name(compute), _name(t.compute_dtype), t.compute_dtype_reason)
        t.compute_dtype, t.compute_dtype_reason = compute, (f"the run's start precision (resumed; here: "
                                                            f"{t.compute_dtype_reason})")


def summary(guard: MismatchGuard, update: tuple[torch.dtype, str] | None = None) -> dict:
    """What ``summary.json`` records of the machine, the sampling precision and (``update``: the
    ``choose_update`` result) the update's compute dtype and why."""
    out = {"cpu": hardware.cpu_record(), "engine_dtype": _name(guard.dtype), "engine_fallback": guard.fell_back}
    if update is not None:
        out |= {"compute_dtype": _name(update[0]), "compute_dtype_reason": update[1]}
    return out
