"""``rollwise bench serve``: the OpenAI-compatible endpoint (``rollwise.serve``) vs the in-process
engine on the same requests, side by side (issue 25).

One ``SlotEngine`` serves both arms, in one process, alternating (endpoint, in-process, then
in-process, endpoint, ...) so that drift in machine load hits both:

- ``endpoint``: ``serve_engine`` on that engine (uvicorn on its thread, the driver stepping the
  engine on another), called by ``c`` clients on one ``AsyncOpenAI`` event loop; each client sends
  its next request when its last one came back, so ``c`` requests are in flight.
- ``in_process``: the same requests on the same engine from this thread, ``c`` in flight the same
  way: submit ``c``, then, after every ``step``, submit one more for each that finished.

The same requests: chat messages rendered by the endpoint's own renderer, each request's seed
as the endpoint derives it from the request's ``seed`` (``derive(seed, 0)``), the same
temperature and ``max_tokens``. So both arms sample the same tokens (checked: each request's
completion text and token count; float effects of a different batch composition could flip a
token, which the results would show as ``same_text`` < 1). The random tiny preset samples nearly
uniformly over its 97 ids, so most requests run ``max_tokens`` and some end at an early EOS —
the same ones in both arms.

Per concurrency level: requests/s and sampled tokens/s of each arm (median over ``repeats``),
their ratios endpoint / in-process (below 1: what HTTP, JSON and the thread hand-offs cost), the
paired ratio (median over adjacent runs), and at concurrency 1 the HTTP overhead per call:
endpoint minus in-process seconds per request. Each arm gets one untimed warm-up per level.
Timed regions are whole request lists. The clients run in this process (the main thread's event
loop), as ``rollout.harness``'s do: the client's, the server's and the driver's Python share one
interpreter lock with the engine's own, so the endpoint arm pays for all of it.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
import threading
import time
from collections import deque

import torch
from pydantic import Field

from rollwise.bench.chat import SMOLLM2
from rollwise.bench.harness import load_settings, session, table
from rollwise.config import ConfigError, StrictModel

ARMS = ("endpoint", "in_process")
REAL_MODEL = "smollm2"


class ServeBenchConfig(StrictModel):
    """Settings of ``rollwise bench serve`` (override with ``--set key=value``)."""

    model: str = Field("tiny", description="a tiny preset (random init), or 'smollm2' = the model at model_path")
    model_path: str = Field(SMOLLM2, description="the 'smollm2' model: a GGUF, pkg: path or HF directory")
    concurrency: list[int] = Field([1, 8, 32], min_length=1, description="requests in flight: one side-by-side "
                                   "measurement per value")
    requests: int = Field(64, ge=1, description="requests per run (each with its own prompt and seed)")
    max_tokens: int = Field(32, ge=1, description="completion limit of every request")
    temperature: float = Field(1.0, ge=0, le=2, description="sampling temperature of every request")
    batch_size: int = Field(32, ge=1, description="engine slots (both arms)")
    seed: int = Field(0, ge=0, description="seeds the model init and the requests (request i: seed + i)")
    repeats: int = Field(3, ge=1, description="timed runs per arm and level (alternating); the median is reported")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default)")


def load_bench_config(overrides: list[str]) -> ServeBenchConfig:
    from rollwise.model.tiny import PRESETS

    cfg = load_settings(ServeBenchConfig, overrides)
    if cfg.model not in (*PRESETS, REAL_MODEL):
        raise ConfigError(f"config field 'model': unknown model '{cfg.model}'; choose from "
                          f"{sorted(PRESETS) + [REAL_MODEL]}")
    if min(cfg.concurrency) < 1:
        raise ConfigError("config field 'concurrency': every value must be >= 1")
    return cfg


def bench_messages(cfg: ServeBenchConfig) -> list[list[dict]]:
    """``requests`` one-message conversations: a short arithmetic question each."""
    import random

    rng = random.Random(cfg.seed)
    return [[{"role": "user", "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}?"}]
            for _ in range(cfg.requests)]


def request_bodies(cfg: ServeBenchConfig, model_name: str, messages: list[list[dict]]) -> list[dict]:
    return [dict(model=model_name, messages=m, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                 seed=cfg.seed + i) for i, m in enumerate(messages)]


def engine_requests(cfg: ServeBenchConfig, service, messages: list[list[dict]]) -> list:
    """The endpoint's requests as it builds them: its renderer's prompt ids, its seeds and stop ids."""
    from rollwise.engine.engine import Request
    from rollwise.engine.sampling import SamplingParams
    from rollwise.seeds import derive

    return [Request(service.renderer.prompt_ids(m),
                    SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_tokens,
                                   stop_token_ids=service.stop_ids, seed=derive(cfg.seed + i, 0)))
            for i, m in enumerate(messages)]


def run_in_process(engine, requests: list, concurrency: int) -> tuple[float, list]:
    """Seconds and completions (request order) with ``concurrency`` requests in flight."""
    waiting, owner, done = deque(range(len(requests))), {}, [None] * len(requests)

    def feed(k: int) -> None:
        for _ in range(min(k, len(waiting))):
            i = waiting.popleft()
            (h,) = engine.submit([requests[i]])
            owner[h] = i

    start = time.perf_counter()
    feed(concurrency)
    while owner:
        for c in engine.step():
            done[owner.pop(c.handle)] = c
            feed(1)
    return time.perf_counter() - start, done


async def _endpoint(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list]:
    import openai

    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600) as client:
        await client.models.list()  # the connection is up before the clock starts
        order, out = iter(range(len(bodies))), [None] * len(bodies)

        async def client_loop() -> None:
            for i in order:  # shared by the clients: each takes the next request
                out[i] = await client.chat.completions.create(**bodies[i])

        start = time.perf_counter()
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        return time.perf_counter() - start, out


def run_endpoint(url: str, bodies: list[dict], concurrency: int) -> tuple[float, list]:
    """Seconds and responses (request order) of ``concurrency`` clients calling the endpoint."""
    return asyncio.run(_endpoint(url, bodies, concurrency))


def _outputs(arm: str, outs: list, tok) -> list[tuple[int, str]]:
    """(sampled tokens, text) per request."""
    if arm == "endpoint":
        return [(r.usage.completion_tokens, r.choices[0].message.content) for r in outs]
    return [(len(c.token_ids), tok.decode(c.token_ids, skip_special_tokens=True)) for c in outs]


def bench_level(cfg: ServeBenchConfig, engine, server, tok, bodies, requests, concurrency: int, status) -> dict:
    """One side-by-side measurement at ``concurrency`` requests in flight."""
    zero = copy.deepcopy(engine.stats)
    run = {"endpoint": lambda: run_endpoint(server.url, bodies, concurrency),
           "in_process": lambda: run_in_process(engine, requests, concurrency)}
    seconds, outputs, stats = {a: [] for a in ARMS}, {}, {}
    for arm in ARMS:
        status.update(f"concurrency {concurrency}: {arm}: warm-up")
        run[arm]()
    for r in range(cfg.repeats):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            status.update(f"concurrency {concurrency}: run {r + 1}/{cfg.repeats}: {arm}")
            engine.stats = copy.deepcopy(zero)  # this run's counters only (the driver is idle between runs)
            s, outs = run[arm]()
            seconds[arm].append(s)
            outputs[arm], stats[arm] = _outputs(arm, outs, tok), engine.stats.as_dict()
    engine.stats = zero
    prompt_tokens = sum(len(q.prompt_ids) for q in requests)
    # every prompt position is prefilled or copied from a batch-mate's equal prefix (a chat template's system prompt)
    placed = {a: stats[a]["prefill_tokens"] + stats[a]["prefix_tokens_shared"] for a in ARMS}
    if placed["endpoint"] != prompt_tokens:
        raise RuntimeError(f"concurrency {concurrency}: the endpoint placed {placed['endpoint']} prompt positions, "
                           f"the in-process prompts have {prompt_tokens}: the arms' prompts differ")
    n = len(requests)
    arms = {}
    for a in ARMS:
        tokens = sum(t for t, _ in outputs[a])
        arms[a] = {"requests_s": statistics.median(n / s for s in seconds[a]),
                   "tokens_s": statistics.median(tokens / s for s in seconds[a]),
                   "tokens": tokens, "engine_steps": stats[a]["steps"], "seconds": seconds[a]}
    same = sum(e == i for e, i in zip(outputs["endpoint"], outputs["in_process"]))
    return {**arms, "requests": n, "prompt_tokens": prompt_tokens,
            "requests_ratio": arms["endpoint"]["requests_s"] / arms["in_process"]["requests_s"],
            "tokens_ratio": arms["endpoint"]["tokens_s"] / arms["in_process"]["tokens_s"],
            "ratio_paired": statistics.median(i / e for e, i in zip(seconds["endpoint"], seconds["in_process"])),
            "overhead_s_per_call": statistics.median((e - i) / n for e, i in
                                                     zip(seconds["endpoint"], seconds["in_process"])),
            "same_text": same / n}


def run_serve_bench(overrides: list[str], console) -> dict:
    """The endpoint vs the in-process engine at each concurrency; print the table, return the results.

    Returns ``{"levels": {"C": {"endpoint": ARM, "in_process": ARM, "requests_ratio", "tokens_ratio",
    "ratio_paired", "overhead_s_per_call", "same_text", ...}}, "http_overhead_ms_per_call", "model",
    "params", "torch_threads", "settings"}`` with ``ARM = {"requests_s", "tokens_s", "tokens",
    "engine_steps", "seconds"}``. Ratios are endpoint / in-process (1: HTTP costs nothing);
    ``http_overhead_ms_per_call`` is at concurrency 1 (None when 1 is not measured)."""
    cfg = load_bench_config(overrides)
    with session(cfg.threads):
        return _run(cfg, console)


def _load(cfg: ServeBenchConfig):
    if cfg.model == REAL_MODEL:
        from rollwise.bench.chat import load_chat_model

        return load_chat_model(cfg.model_path, seed=cfg.seed)
    from rollwise.model.tiny import build_tiny

    return build_tiny(cfg.model, seed=cfg.seed)


def _run(cfg: ServeBenchConfig, console) -> dict:
    from rollwise.engine.slots import SlotEngine
    from rollwise.serve import serve_engine
    from rollwise.tasks.tool_calls import tool_format

    with console.status(f"loading {cfg.model}"):
        model, tok = _load(cfg)
    model.eval()
    params_count = sum(p.numel() for p in model.parameters())
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=cfg.batch_size, seed=cfg.seed)
    server = serve_engine(engine, tok, tool_format("auto", tok), model_name=cfg.model,
                          default_max_tokens=cfg.max_tokens, seed=cfg.seed)
    stop = threading.Event()
    driver = threading.Thread(target=server.drive, args=(stop.is_set,), name="bench-serve-driver", daemon=True)
    driver.start()
    messages = bench_messages(cfg)
    bodies = request_bodies(cfg, cfg.model, messages)
    requests = engine_requests(cfg, server.service, messages)
    levels = {}
    try:
        with console.status("endpoint vs in-process") as status:
            for c in cfg.concurrency:
                levels[str(c)] = bench_level(cfg, engine, server, tok, bodies, requests, c, status)
    finally:
        stop.set()
        driver.join(timeout=10)
        server.close()
    overhead = levels["1"]["overhead_s_per_call"] * 1e3 if "1" in levels else None
    _print_table(console, cfg, params_count, levels, overhead)
    return {"levels": levels, "http_overhead_ms_per_call": overhead, "model": cfg.model, "params": params_count,
            "torch_threads": torch.get_num_threads(), "settings": cfg.model_dump()}


def _print_table(console, cfg: ServeBenchConfig, params_count: int, levels: dict, overhead: float | None) -> None:
    rows = []
    for c, r in levels.items():
        e, i = r["endpoint"], r["in_process"]
        rows.append([c, f"{e['requests_s']:.1f}", f"{i['requests_s']:.1f}", f"{r['requests_ratio']:.2f}x",
                     f"{e['tokens_s']:,.0f}", f"{i['tokens_s']:,.0f}", f"{r['tokens_ratio']:.2f}x",
                     f"{r['ratio_paired']:.2f}x", f"{r['same_text']:.0%}"])
    console.print(table(
        f"the endpoint vs the in-process engine — {cfg.model} ({params_count:,} params), {cfg.requests} requests of "
        f"{cfg.max_tokens} tokens, median of {cfg.repeats}",
        ("in flight", "req/s endpoint", "req/s in-process", "ratio", "tok/s endpoint", "tok/s in-process", "ratio",
         "paired", "same text"),
        rows))
    if overhead is not None:
        console.print(f"HTTP overhead per call at concurrency 1: {overhead:.2f} ms", highlight=False)
