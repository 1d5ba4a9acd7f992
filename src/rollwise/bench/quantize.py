"""The precision schemes ``rollwise bench precision`` compares, as changes to a ``LlamaForward``.

Every scheme starts from an fp32 ``LlamaForward`` (``rollwise.engine.llama``: the slot engine's own
prefill and decode) and changes only the weights its linears and embedding read, so all schemes run
the engine's arithmetic and differ only where the scheme says:

- ``int8_row`` (probe): weight-only int8, one scale per output row (symmetric, scale = absmax/127,
  ``torch.round``: half to even), quantized then dequantized in fp32 (``qdq_rows``).
- ``q8_0`` (probe): llama.cpp's Q8_0 for weights AND activations: blocks of 32 along the input
  dim, one scale per block, as ``quantize_row_q8_0_ref`` in ggml-quants.c: d = absmax/127 stored
  as fp16, q = roundf(x · (1/d)) (half away from zero), x̂ = q · d (``qdq_q8_0``). The activation
  going into every linear is quantized the same way (``KernelWeight``); ggml's AVX2 path rounds
  activations half to even instead, which differs only on exact ties.
- Both probes quantize the embedding too (as an int8 model file stores it; a tied LM head and
  embedding are one tensor, quantized once), and keep norms, attention and the KV cache in fp32.
- ``fbgemm_int8`` / ``fbgemm_int8_row`` (real kernels): ``torch.ao.quantization.quantize_dynamic``
  on every linear (per-tensor, or per-row weights), activations quantized per call with one
  scale per tensor; the embedding stays fp32, as ``quantize_dynamic`` leaves ``nn.Embedding``.
- ``torchao_int8wo`` (real kernel, when torchao is installed): torchao's ``Int8WeightOnlyConfig``.

A probe has no kernel: it measures what a scheme does to the distribution, never its speed. A real
kernel runs inside the slot engine itself (``KernelWeight`` routes ``F.linear`` to it), so its
tokens/s are the engine's with that kernel.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

Q8_BLOCK = 32  # QK8_0 in ggml


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: to the nearest integer, ties away from zero (``torch.round`` ties to even).

    >>> round_half_away(torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 2.4])).tolist()
    [1.0, 2.0, 3.0, -1.0, -3.0, 2.0]
    """
    t = x.trunc()
    return torch.where((x - t).abs() == 0.5, t + x.sign(), torch.round(x))


def qdq_q8_0(x: torch.Tensor) -> torch.Tensor:
    """``x`` (last dim a multiple of 32) through Q8_0 and back, in fp32 (see the module docstring)."""
    if x.shape[-1] % Q8_BLOCK:
        raise ValueError(f"Q8_0 needs the input dim to be a multiple of {Q8_BLOCK}, got {x.shape[-1]}")
    blocks = x.float().reshape(*x.shape[:-1], -1, Q8_BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = round_half_away(blocks * inv)
    return (q * d.half().float()).reshape(x.shape)


def qdq_rows(w: torch.Tensor) -> torch.Tensor:
    """``w [out, in]`` through symmetric int8 with one scale (absmax/127) per output row, and back."""
    scale = w.abs().amax(-1, keepdim=True).float() / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(w.float() / scale).clamp(-127, 127) * scale).to(w.dtype)


class KernelWeight(torch.Tensor):
    """A weight tensor that ``F.linear`` computes with another kernel: ``F.linear(x, w, b)`` calls
    ``w.kernel(x, b)``; every other use sees the plain tensor (its values are the weight's)."""

    kernel: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]

    @staticmethod
    def __new__(cls, weight: torch.Tensor, kernel):
        t = torch.Tensor._make_subclass(cls, weight.detach())
        t.kernel = kernel
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return w.kernel(x.as_subclass(torch.Tensor) if isinstance(x, KernelWeight) else x, bias)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def map_weights(fwd, linear: Callable, embed: Callable | None = None) -> None:
    """Replace every linear's weight of ``fwd`` (``LlamaForward``) by ``linear(weight, bias)`` and
    its embedding by ``embed(weight)`` (None: kept). A tensor read twice (a tied head) maps once."""
    done: dict[int, torch.Tensor] = {}

    def once(key, fn, *args):
        if key not in done:
            done[key] = fn(*args)
        return done[key]

    with torch.no_grad():
        if embed is not None:
            fwd.embed = once(("e", id(fwd.embed)), embed, fwd.embed)
        w, b = fwd.lm_head
        fwd.lm_head = (once(("l", id(w)), linear, w, b), b)
        for layer in fwd.layers:
            for name in ("q", "k", "v", "o", "gate", "up", "down"):
                w, b = getattr(layer, name)
                setattr(layer, name, (once(("l", id(w)), linear, w, b), b))


def _q8_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(qdq_q8_0(x), w, b)


def apply_int8_row(fwd) -> None:
    """The ``int8_row`` probe: weights (and the embedding) through per-row int8."""
    map_weights(fwd, lambda w, b: qdq_rows(w), qdq_rows)


def apply_q8_0(fwd) -> None:
    """The ``q8_0`` probe: weights (and the embedding) through Q8_0; activations into every linear too."""
    cache: dict[int, torch.Tensor] = {}

    def embed(w):
        cache[id(w)] = qdq_q8_0(w)
        return cache[id(w)]

    def linear(w, b):
        plain = cache.get(id(w))  # a tied head: the embedding's quantized tensor, quantized once
        plain = qdq_q8_0(w) if plain is None else plain
        return KernelWeight(plain, lambda x, bias, plain=plain: _q8_linear(x, plain, bias))

    map_weights(fwd, linear, embed)


def _as_linear(w: torch.Tensor, b: torch.Tensor | None) -> torch.nn.Linear:
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
    with torch.no_grad():
        lin.weight.copy_(w)
        if b is not None:
            lin.bias.copy_(b)
    return lin


def kernel_scheme(make_module: Callable[[torch.nn.Linear], torch.nn.Module]) -> Callable:
    """A real-kernel scheme: every linear becomes ``make_module(nn.Linear)``, called by ``F.linear``."""
    def apply(fwd) -> None:
        def linear(w, b):
            module = make_module(_as_linear(w, b)).eval()
            return KernelWeight(w, lambda x, bias, module=module: module(x))

        map_weights(fwd, linear)

    return apply


def _fbgemm(lin: torch.nn.Linear, per_row: bool) -> torch.nn.Module:
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if per_row else default_dynamic_qconfig
    with warnings.catch_warnings():  # torch.ao.quantization says it is deprecated (for torchao): still here in 2.13
        warnings.simplefilter("ignore")
        return quantize_dynamic(torch.nn.Sequential(lin), {torch.nn.Linear: qconfig}, dtype=torch.qint8)


def _torchao_int8wo(lin: torch.nn.Linear) -> torch.nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    module = torch.nn.Sequential(copy.deepcopy(lin))
    quantize_(module, Int8WeightOnlyConfig())
    return module


def torchao_available() -> bool:
    try:
        import torchao.quantization  # noqa: F401
    except Exception:  # not installed, or built for another torch: the scheme is skipped, with the reason
        return False
    return True


PROBES = {"int8_row": apply_int8_row, "q8_0": apply_q8_0}
KERNELS = {"fbgemm_int8": kernel_scheme(lambda lin: _fbgemm(lin, False)),
           "fbgemm_int8_row": kernel_scheme(lambda lin: _fbgemm(lin, True)),
           "torchao_int8wo": kernel_scheme(_torchao_int8wo)}


def _int8pack(lin: torch.nn.Linear) -> Callable:
    """torch's own weight-only int8 matmul (``torch._weight_int8pack_mm``, per-row scales): the op
    torchao's int8 weight-only path is built on where it has a fast CPU kernel."""
    w = lin.weight.detach()
    scale = w.abs().amax(-1).clamp_min(1e-12) / 127
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return lambda x: torch._weight_int8pack_mm(x, q, scale)


def linear_kernels() -> dict[str, Callable[[torch.nn.Linear], Callable]]:
    """``name -> (nn.Linear -> x ↦ y)``: every linear kernel this machine can time (bf16 and the
    int8 ones), besides fp32's own."""
    out = {"bf16": lambda lin: (lambda x, w=lin.weight.detach().bfloat16(): F.linear(x.bfloat16(), w)),
           "fbgemm_int8": lambda lin: _fbgemm(lin, False), "fbgemm_int8_row": lambda lin: _fbgemm(lin, True)}
    if hasattr(torch, "_weight_int8pack_mm"):
        out["torch_int8pack_mm"] = _int8pack
    if torchao_available():
        out["torchao_int8wo"] = _torchao_int8wo
    return out


def linear_speed(hidden: int, intermediate: int, vocab: int, rows: int = 32, repeats: int = 5) -> dict:
    """fp32 time / kernel time of ``F.linear`` at a model's MLP up-projection [rows, hidden] ×
    [hidden, intermediate] and LM head [rows, hidden] × [hidden, vocab] (best of ``repeats`` after
    a warm-up; > 1: faster than fp32), per kernel of ``linear_kernels``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=gen)
    out: dict[str, dict[str, float]] = {}
    for shape, n_out in (("mlp_up", intermediate), ("lm_head", vocab)):
        lin = torch.nn.Linear(hidden, n_out, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n_out, hidden, generator=gen) / hidden**0.5)
            fp32 = _best(lin, x, repeats)
            for name, make in linear_kernels().items():
                out.setdefault(name, {})[shape] = fp32 / _best(make(lin), x, repeats)
    return out


def _best(fn, x: torch.Tensor, repeats: int) -> float:
    import time

    times = []
    for _ in range(repeats + 1):  # the first call warms up (packing, kernel choice, page faults)
        start = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - start)
    return min(times[1:])
