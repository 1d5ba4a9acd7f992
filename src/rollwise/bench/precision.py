"""``rollwise bench precision``: what each sampling precision does to the policy, and what it buys.

For the policy at ``model.path`` (fp32; default the tiny ``model.preset``), on the machine it runs
on, per scheme (``bench/quantize.py`` says exactly what each one does):

- ``fp32``: the reference — the slot engine's forward on the fp32 weights;
- ``bf16``: the engine's own bf16 copy (``LlamaForward(dtype=bfloat16)``, what
  ``rollout.engine_dtype=bfloat16`` samples from);
- ``int8_row`` and ``q8_0``: fake-quantized probes (quantize → dequantize in fp32): weight-only int8
  per output row, and llama.cpp's Q8_0 (weights and activations in blocks of 32);
- ``fbgemm_int8`` (per-tensor weights), ``fbgemm_int8_row`` (per-row weights): torch's dynamic
  int8 kernel (``quantize_dynamic``); ``torchao_int8wo``: torchao's int8 weight-only kernel, measured
  when torchao is installed.

Columns, as ``llama-perplexity --kl-divergence`` computes them: teacher-forced KL(fp32 ‖ scheme)
over the full vocabulary at every completion position of the same token sequence (mean and p99,
nats/token) and top-1 agreement (the argmax of both is the same token), on (a) fixed text — the
task's prompts with their reference demonstrations — and (b) completions the fp32 engine sampled
(fixed seed, stopping at EOS). Every scheme is teacher-forced through the engine's own ``prefill``
(the prompt) and ``decode`` (one completion token at a time): the arithmetic the engine samples
with. Speed: tokens/s of sampling in the slot engine (EOS off, every request its full length) for
each scheme with a real kernel, timed in turn in one run (rotating the order each repeat) and
given as the median of each repeat's ratio to fp32; a probe has no speed ("probe, no kernel").

The int8 verdict (issue 34): an int8 engine path earns a place only where a real kernel is faster
than the faster of fp32 and bf16 here while within ``KL_BOUND`` of fp32 on the sampled text; the
bench prints which kernel fails which half.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Literal

import torch
from pydantic import Field

from rollwise.bench.harness import load_settings, session, table
from rollwise.bench.quantize import linear_speed
from rollwise.config import ConfigError, StrictModel
from rollwise.model.load import ModelConfig

REFERENCE = "fp32"
SCHEMES = ("fp32", "bf16", "int8_row", "q8_0", "fbgemm_int8", "fbgemm_int8_row", "torchao_int8wo")
KL_BOUND = 0.01  # nats/token: the default rollout.mismatch_kl_bound, the bound
KINDS = {"fp32": "reference", "bf16": "engine copy", "int8_row": "probe", "q8_0": "probe"}  # else "kernel"
PROBE_KERNELS = {  # where a probe's layout has a CPU kernel usable from torch
    "int8_row": "its layout's kernels: torchao_int8wo, torch._weight_int8pack_mm (see linear_vs_fp32)",
    "q8_0": "no CPU kernel for int8 weights and activations in blocks usable from torch (llama.cpp has its own)",
}


class PrecisionBenchConfig(StrictModel):
    """Settings of ``rollwise bench precision`` (override with ``--set key=value``)."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy, loaded in float32 "
                               "(model.path, or the tiny model.preset)")
    schemes: list[Literal[SCHEMES]] = Field(list(SCHEMES), min_length=1, description="schemes compared with fp32 "
                                            "(fp32 is always measured)")
    task: Literal["auto", "arith", "chain_sum"] = Field("auto", description="the prompts and reference completions: "
                                                        "auto = chain_sum chat prompts when the tokenizer has a chat "
                                                        "template, else arith")
    num_prompts: int = Field(32, ge=1, description="prompts for the fixed text and for the sampled completions")
    max_new_tokens: int = Field(128, ge=1, description="sampled completions: at most this many tokens (EOS stops)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the completions and the speed runs")
    batch_size: int = Field(32, ge=1, description="rows per teacher-forced batch, and engine slots")
    speed: bool = Field(True, description="measure sampling tokens/s of the schemes with a real kernel")
    speed_prompts: int = Field(16, ge=1, description="speed: requests per run")
    speed_new_tokens: int = Field(64, ge=1, description="speed: tokens each request samples (EOS off)")
    repeats: int = Field(3, ge=1, description="speed: timed runs per scheme (the order rotates each repeat)")
    seed: int = Field(0, ge=0, description="seeds the prompts and the sampling")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default)")


def load_bench_config(overrides: list[str]) -> PrecisionBenchConfig:
    cfg = load_settings(PrecisionBenchConfig, overrides)
    if cfg.model.dtype != "float32":
        raise ConfigError(f"config field 'model.dtype' is {cfg.model.dtype}: the bench loads the policy in "
                          "float32 (the reference) and makes every other precision from it; drop the override")
    if REFERENCE not in cfg.schemes:
        cfg = cfg.model_copy(update={"schemes": [REFERENCE, *cfg.schemes]})
    return cfg


# -- the measures ------------------------------------------------------------------------------
def token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(ref ‖ other) per row over the full vocabulary, in float64: Σ_v p(v) (log p(v) − log q(v))
    with p = softmax(ref_logits), q = softmax(logits) ([N, V] each → [N])."""
    log_p = torch.log_softmax(ref_logits.double(), -1)
    log_q = torch.log_softmax(logits.double(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def summarize(kl: torch.Tensor, same_top1: torch.Tensor) -> dict:
    """Per-token KL [N] and top-1 agreement [N] as the bench reports them."""
    if kl.numel() == 0:
        return {"tokens": 0, "kl_mean": None, "kl_p99": None, "kl_max": None, "top1": None}
    return {"tokens": kl.numel(), "kl_mean": kl.mean().item(), "kl_p99": torch.quantile(kl, 0.99).item(),
            "kl_max": kl.max().item(), "top1": same_top1.double().mean().item()}


def teacher_logits(fwd, seqs: list[tuple[list[int], list[int]]]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The logits ``fwd`` (a ``LlamaForward``) gives each completion position of ``seqs``
    ((prompt ids, completion ids) pairs), as the engine computes them: the prompts prefilled, then
    the completions fed one token per decode step. Yields, per step t, (logits [m, V] float32
    predicting completion token t, rows [m] bool: the rows whose completion has a token t)."""
    m, lens = len(seqs), [len(p) for p, _ in seqs]
    width, steps = max(lens), max(len(c) for _, c in seqs)
    kv = fwd.new_cache(m, width + steps)
    # a prefix every prompt shares (a chat template's system prompt) is prefilled once and copied, as the
    # engine does; each row keeps at least its last prompt token to prefill
    start = _common_prefix([p for p, _ in seqs], min(lens) - 1)
    if start:
        fwd.prefill(kv, torch.tensor([seqs[0][0][:start]], device=fwd.device), [start], 0)
        kv.copy_rows([0] * (m - 1), list(range(1, m)), start)
    ids = torch.tensor([p[start:] + [0] * (width - len(p)) for p, _ in seqs], device=fwd.device)  # pad: masked
    valid = lambda t: torch.tensor([t < len(c) for _, c in seqs], device=fwd.device)  # noqa: E731
    yield fwd.prefill(kv, ids, [n - start for n in lens], 0, start).float(), valid(0)
    for t in range(steps - 1):
        tokens = torch.tensor([c[t] if t < len(c) else 0 for _, c in seqs], device=fwd.device)
        pos = torch.tensor([n + t for n in lens], device=fwd.device)
        yield fwd.decode(kv, tokens, pos, [(0, m, int(pos.max()) + 1)]).float(), valid(t + 1)


def _common_prefix(rows: list[list[int]], limit: int) -> int:
    n = 0
    while n < limit and all(r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def compare(forwards: dict, seqs: list[tuple[list[int], list[int]]], batch_size: int, status=None,
            label: str = "") -> dict[str, dict]:
    """Every forward of ``forwards`` against ``forwards[REFERENCE]`` on ``seqs``, position by position
    (all schemes in lockstep, so no logits are kept past their step): ``summarize`` per scheme."""
    seqs = [(p, c) for p, c in seqs if c]
    kls = {name: [] for name in forwards}
    same = {name: [] for name in forwards}
    with torch.no_grad():
        for a in range(0, len(seqs), batch_size):
            if status is not None:
                status.update(f"{label}: sequences {a + 1}-{min(a + batch_size, len(seqs))} of {len(seqs)}")
            streams = [teacher_logits(f, seqs[a:a + batch_size]) for f in forwards.values()]
            for steps in zip(*streams):
                ref, rows = steps[0][0][steps[0][1]], steps[0][1]
                for name, (logits, _) in zip(forwards, steps):
                    kls[name].append(token_kl(ref, logits[rows]))
                    same[name].append(ref.argmax(-1) == logits[rows].argmax(-1))
    return {name: summarize(torch.cat(kls[name]) if kls[name] else torch.zeros(0),
                            torch.cat(same[name]) if same[name] else torch.zeros(0)) for name in forwards}


# -- the schemes -------------------------------------------------------------------------------
def build_forward(model, scheme: str):
    """The slot engine's ``LlamaForward`` over ``model`` in ``scheme`` (raises ValueError/ImportError
    when the scheme cannot run here: the bench reports it skipped, with the reason)."""
    from rollwise.bench.quantize import KERNELS, PROBES, torchao_available
    from rollwise.engine.llama import LlamaForward

    if scheme == "bf16":
        return LlamaForward(model, dtype=torch.bfloat16)
    if scheme == "torchao_int8wo" and not torchao_available():
        raise ImportError("torchao is not installed (pip install torchao to measure its int8 weight-only kernel)")
    fwd = LlamaForward(model)
    (PROBES.get(scheme) or KERNELS.get(scheme) or (lambda f: None))(fwd)
    return fwd


def build_engine(model, scheme: str, pad_id: int, cfg: PrecisionBenchConfig):
    """A slot engine sampling in ``scheme`` (a scheme with a real kernel: fp32, bf16 or a kernel)."""
    from rollwise.bench.quantize import KERNELS
    from rollwise.engine.slots import SlotEngine

    dtype = torch.bfloat16 if scheme == "bf16" else None
    engine = SlotEngine(model, pad_token_id=pad_id, max_batch_size=cfg.batch_size, seed=cfg.seed, dtype=dtype)
    if scheme in KERNELS:
        KERNELS[scheme](engine.forward)
    return engine


# -- the text ----------------------------------------------------------------------------------
def fixed_text(tok, cfg: PrecisionBenchConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference completion ids + EOS) for the task's first ``num_prompts`` train prompts:
    chain_sum chat prompts (the SmolLM2 recipe's) or arith (the tiny model's), with the task's demonstration."""
    from rollwise.model.load import encode_prompt

    name = cfg.task if cfg.task != "auto" else ("chain_sum" if getattr(tok, "chat_template", None) else "arith")
    if name == "arith":
        from rollwise.tasks.arith import build

        task = build(cfg.seed)
    else:
        from rollwise.bench.chat import task_overrides
        from rollwise.train.config import load_run_config

        task = load_run_config(None, task_overrides("smollm2", 1)).task.build(cfg.seed)
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    out = []
    for i in range(cfg.num_prompts):
        prompt = task.train.get(i)
        reference = tok(task.demonstrate(prompt), add_special_tokens=False)["input_ids"]
        out.append((encode_prompt(tok, prompt), reference + eos))
    return out


def sampled_text(model, tok, prompts: list[list[int]], cfg: PrecisionBenchConfig) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) the fp32 engine samples from ``prompts`` (seed ``cfg.seed``, EOS stops)."""
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams

    engine = build_engine(model, REFERENCE, tok.pad_token_id, cfg)
    stop = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, stop_token_ids=stop)
    with torch.no_grad():
        outs = engine.generate([Request(p, params) for p in prompts])
    return [(p, o.token_ids) for p, o in zip(prompts, outs)]


# -- speed -------------------------------------------------------------------------------------
def measure_speed(engines: dict, prompts: list[list[int]], cfg: PrecisionBenchConfig, status) -> dict[str, dict]:
    """Sampling tokens/s of each engine (EOS off: ``speed_new_tokens`` per request), timed in turn;
    ``vs_fp32`` is the median over repeats of fp32's seconds / the scheme's in that repeat."""
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams

    prompts = (prompts * (cfg.speed_prompts // len(prompts) + 1))[:cfg.speed_prompts]
    useful = cfg.speed_new_tokens * len(prompts)
    requests = lambda n: [Request(p, SamplingParams(temperature=cfg.temperature, max_new_tokens=n))  # noqa: E731
                          for p in prompts]
    names = list(engines)
    seconds = {name: [] for name in names}
    with torch.no_grad():
        for name in names:
            status.update(f"speed: {name} warm-up")
            engines[name].generate(requests(4))
        for r in range(cfg.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                status.update(f"speed: run {r + 1}/{cfg.repeats}, {name}")
                start = time.perf_counter()
                got = sum(len(o.token_ids) for o in engines[name].generate(requests(cfg.speed_new_tokens)))
                seconds[name].append(time.perf_counter() - start)
                if got != useful:
                    raise RuntimeError(f"{name}: the engine sampled {got} tokens, expected {useful}")
    ref = seconds[REFERENCE]
    return {name: {"tok_s": statistics.median(useful / s for s in secs), "tokens": useful, "seconds": secs,
                   "vs_fp32": statistics.median(a / b for a, b in zip(ref, secs))} for name, secs in seconds.items()}


# -- the run -----------------------------------------------------------------------------------
def run_precision_bench(overrides: list[str], console) -> dict:
    """Measure every scheme of the settings on this machine; print the table and the int8 verdict.

    Returns ``{"schemes": {NAME: {"kind", "fixed": {...}, "sampled": {...}, "speed": {...} | None}},
    "skipped": {NAME: why}, "verdict": {...}, "tokens": {...}, "torch", "torch_threads", "settings"}``;
    ``fixed``/``sampled`` hold ``summarize``'s fields (``kl_mean``, ``kl_p99``, ``top1``, ``tokens``).
    """
    cfg = load_bench_config(overrides)
    with session(cfg.threads), console.status("loading the policy") as status:
        results = _run(cfg, status)
    _print(console, cfg, results)
    return results


def _load(cfg: PrecisionBenchConfig):
    from rollwise.engine.llama import UnsupportedModelError, check_supported
    from rollwise.model.load import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(cfg.model, seed=cfg.seed)
    try:
        check_supported(model)
    except UnsupportedModelError as err:
        raise ConfigError(f"config field 'model.path': {err}; the bench runs the slot engine's forward") from None
    return model.eval(), tok


def _run(cfg: PrecisionBenchConfig, status) -> dict:
    model, tok = _load(cfg)
    forwards, skipped = {}, {}
    for name in cfg.schemes:
        status.update(f"preparing {name}")
        try:
            forwards[name] = build_forward(model, name)
        except (ValueError, ImportError) as err:
            skipped[name] = str(err)
    fixed = fixed_text(tok, cfg)
    status.update(f"sampling {cfg.num_prompts} completions in fp32")
    sampled = sampled_text(model, tok, [p for p, _ in fixed], cfg)
    fixed_kl = compare(forwards, fixed, cfg.batch_size, status, "fixed text")
    sampled_kl = compare(forwards, sampled, cfg.batch_size, status, "sampled text")
    forwards.clear()  # the teacher-forcing copies go before the engines make theirs
    speed, kernels = {}, {}
    if cfg.speed:
        fast = [n for n in cfg.schemes if KINDS.get(n) != "probe" and n not in skipped]
        engines = {n: build_engine(model, n, tok.pad_token_id, cfg) for n in fast}
        speed = measure_speed(engines, [p for p, _ in fixed], cfg, status)
        status.update("F.linear at the model's shapes")
        c = model.config
        kernels = linear_speed(c.hidden_size, c.intermediate_size, c.vocab_size)
    schemes = {n: {"kind": KINDS.get(n, "kernel"), "fixed": fixed_kl[n], "sampled": sampled_kl[n],
                   "speed": speed.get(n)} for n in cfg.schemes if n not in skipped}
    from rollwise.hardware import cpu_info, native_bf16

    return {"model": cfg.model.path or f"preset:{cfg.model.preset}",
            "params": sum(p.numel() for p in model.parameters()), "native_bf16": native_bf16(cpu_info()),
            "schemes": schemes, "skipped": skipped, "verdict": verdict(schemes, skipped), "linear_vs_fp32": kernels,
            "tokens": {"fixed": fixed_kl[REFERENCE]["tokens"], "sampled": sampled_kl[REFERENCE]["tokens"],
                       "speed_per_run": cfg.speed_new_tokens * cfg.speed_prompts if cfg.speed else 0},
            "kl_bound": KL_BOUND, "torch": torch.__version__, "torchao": _version("torchao"),
            "torch_threads": torch.get_num_threads(),
            "settings": cfg.model_dump()}


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def verdict(schemes: dict, skipped: dict) -> dict:
    """Whether an int8 engine path earns a place: a real int8 kernel faster than the faster of fp32
    and bf16 while within ``KL_BOUND`` nats/token of fp32 on the sampled text; one line per scheme why."""
    speeds = {n: s["speed"]["vs_fp32"] for n, s in schemes.items() if s["speed"]}
    if REFERENCE not in speeds:
        return {"int8_engine": None, "lines": ["speed not measured (speed=false): no verdict"]}
    best = max((n for n in ("fp32", "bf16") if n in speeds), key=speeds.get)
    lines, ships = [], []
    for name, s in schemes.items():
        kl = s["sampled"]["kl_mean"]
        if s["kind"] == "probe":
            lines.append(f"{name}: {_kl(kl)} nats/token — probe, no kernel; {PROBE_KERNELS[name]}")
        elif s["kind"] == "kernel":
            fast, close = speeds[name] > speeds[best], kl is not None and kl <= KL_BOUND
            ships += [name] if fast and close else []
            why = "earns a place" if fast and close else " and ".join(
                w for w, bad in ((f"slower than {best}", not fast), (f"over {KL_BOUND} nats/token", not close)) if bad)
            lines.append(f"{name}: {speeds[name]:.2f}x fp32 ({best}: {speeds[best]:.2f}x), {_kl(kl)} nats/token"
                         f" — {why}")
    lines += [f"{name}: not measured — {why}" for name, why in skipped.items()]
    return {"int8_engine": bool(ships), "fastest_reference": best, "kernels_that_qualify": ships, "lines": lines}


def _cell(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _kl(value) -> str:
    """A KL in nats/token: 4 decimals, or 2 significant digits below 0.001 (bf16 on a tiny model)."""
    return "—" if value is None else f"{value:.4f}" if value == 0 or value >= 1e-3 else f"{value:.1e}"


def _print(console, cfg: PrecisionBenchConfig, res: dict) -> None:
    rows = []
    for name, s in res["schemes"].items():
        f, g, sp = s["fixed"], s["sampled"], s["speed"]
        speed = [f"{sp['tok_s']:,.1f}", f"{sp['vs_fp32']:.2f}x"] if sp else ["probe, no kernel", ""] \
            if s["kind"] == "probe" else ["—", ""]
        rows.append([name, s["kind"], _kl(f["kl_mean"]), _kl(f["kl_p99"]), _cell(f["top1"], ".1%"),
                     _kl(g["kl_mean"]), _kl(g["kl_p99"]), _cell(g["top1"], ".1%"), *speed])
    t = res["tokens"]
    console.print(table(
        f"precision vs fp32 — {res['model']} ({res['params']:,} params), KL(fp32 ‖ scheme) nats/token over "
        f"{t['fixed']:,} fixed / {t['sampled']:,} sampled tokens, {res['torch_threads']} thread(s)",
        ("scheme", "kind", "fixed KL", "fixed p99", "fixed top-1", "sampled KL", "sampled p99", "sampled top-1",
         "tok/s", "vs fp32"), rows, left=("kind",)))
    if not res["native_bf16"]:
        console.print("this CPU has no native bf16 (avx512_bf16/amx_bf16): bf16 runs by conversion, so its speed "
                      "here says nothing about a CPU that has it", highlight=False)
    if res["linear_vs_fp32"]:
        console.print(table("F.linear at the model's shapes, 32 rows: fp32 time / kernel time (> 1: faster)",
                            ("kernel", "MLP up-projection", "LM head"),
                            [[k, f"{r['mlp_up']:.2f}x", f"{r['lm_head']:.2f}x"]
                             for k, r in res["linear_vs_fp32"].items()]))
    v = res["verdict"]
    head = {True: "an int8 engine path earns a place", False: "no int8 engine path", None: "no verdict"}
    console.print(f"int8 verdict: {head[v['int8_engine']]}", highlight=False)
    for line in v["lines"]:
        console.print(f"  {line}", highlight=False)
