"""``rollwise bench multiturn``: multi-turn episodes with the KV cache kept across turns vs the
conversation re-prefilled every turn (the naive harness), side by side (issue 24).

Both arms run ``generate/episode.py``'s ``EpisodeSampler`` on one ``SlotEngine`` (a tiny preset,
random init, or ``model``: a ``model.path`` as recipes take it, loaded by the training loader), the
same prompts, seeds and settings, in the same process, alternating (kept, naive, then naive, kept,
...) so that drift in machine load hits both:

- ``kept``: the engine as it is. A finished turn keeps its cached keys/values
  (``SamplingParams.keep_cache``) and the next turn ``resume``s from them: only the last sampled
  id and the inserted tool result are prefilled (``stats.restored_tokens`` are copied back).
- ``naive``: the same engine seen through a wrapper without ``resume``, so the episode loop
  submits prompt + conversation so far as a new prompt every turn, as a harness that calls a
  plain generate endpoint per turn does.

What is measured is the engine work of a fixed number of turns, not a policy. A random tiny model
never writes a tool call itself (nor does an untrained chat model reliably), so the tool format
reads a ``calculate("6*7")`` call in every finished turn (as ``AlwaysCall`` does in
tests/test_episodes.py), and the built-in ``calculator`` environment answers it. The format is the
one training picks (``rollout.tool_format=auto``): ``plain`` for a model without a chat template
(``<result>42</result>`` inserted as ids), ``hermes`` for one with (SmolLM2): the prompt is rendered
by the template with the tools in it (``ChatRenderer``), and between turns go the end-of-turn token
that closes the cut turn, then the ids the template renders for the tool message and the next
assistant header — what a SmolLM2 agent episode inserts. EOS is off and every turn is
cut at exactly ``turn_tokens`` sampled ids (a wrapper sets each turn's ``max_new_tokens`` and
reads the cut as a finished turn), so every episode runs ``max_turns`` turns of equal length in
both arms. Both arms sample with the same per-turn seeds, so they sample the same tokens: the
bench checks that their completion ids are identical, and that what the naive arm prefills
beyond the kept one is exactly what the kept arm restored; every episode carries the inserted ids
at the end of each turn.

Prompts: ``num_prompts`` arith prompts, each after ``shots`` worked examples (~50 tokens each: real
agent prompts carry instructions), ``episodes`` episodes per prompt, all in one engine wave
(``batch_size`` slots). Per arm: prefill and restored tokens per episode (engine counters over
the run), episodes/s (median over ``repeats``); paired: naive/kept seconds, wall and this process's
CPU (median over adjacent pairs: on a shared machine the CPU ratio is the steadier one), and
naive/kept prefill tokens. ``max_turns`` is a list: one side-by-side measurement
per conversation length (the naive arm's prefill grows with the square of the turns, the kept
arm's linearly). Each arm gets one untimed warm-up per length. Timed regions are whole
``generate`` calls (environment calls and tokenizer work included, the same in both arms).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from pydantic import Field

from rollwise.bench.harness import load_settings, session, table
from rollwise.config import ConfigError, StrictModel
from rollwise.generate.episode import EpisodeSampler
from rollwise.tasks.tool_calls import Hermes, Plain, ToolCall

EXPRESSION = "6*7"  # what every turn asks the calculator
ARMS = ("kept", "naive")


class MultiturnBenchConfig(StrictModel):
    """Settings of ``rollwise bench multiturn`` (override with ``--set key=value``)."""

    preset: str = Field("small", description="tiny model preset (random init), when `model` is null")
    model: str | None = Field(None, description="instead of `preset`: a model.path as recipes take it (HF directory, "
                              ".gguf, pkg:<package>/<file>); with a chat template the episodes use `hermes` through it")
    num_prompts: int = Field(16, ge=1, description="arith prompts")
    episodes: int = Field(4, ge=1, description="episodes per prompt")
    max_turns: list[int] = Field([2, 4, 8], min_length=1, description="model turns per episode: one side-by-side "
                                 "measurement per value")
    turn_tokens: int = Field(24, ge=1, description="sampled ids per turn (EOS off; every turn is cut here)")
    shots: int = Field(2, ge=0, description="worked arith examples before each question (~50 tokens each)")
    batch_size: int = Field(64, ge=1, description="engine slots (num_prompts × episodes fit in one wave by default)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature, the same for both arms")
    seed: int = Field(0, ge=0, description="seeds the model init, the prompts and the episodes' sampling")
    repeats: int = Field(3, ge=1, description="timed runs per arm (alternating); the median is reported")
    threads: int = Field(1, ge=0, description="torch threads for both arms (0 = torch's default)")


def load_bench_config(overrides: list[str]) -> MultiturnBenchConfig:
    from rollwise.model.tiny import PRESETS

    cfg = load_settings(MultiturnBenchConfig, overrides)
    if cfg.model is not None and "preset" in cfg.model_fields_set:
        raise ConfigError("config field 'preset': set either preset (a random tiny model) or model, not both")
    if cfg.model is None and cfg.preset not in PRESETS:
        raise ConfigError(f"config field 'preset': unknown preset '{cfg.preset}'; choose from {sorted(PRESETS)}")
    if min(cfg.max_turns) < 2:
        raise ConfigError("config field 'max_turns': every value must be >= 2 (one turn has nothing to keep)")
    return cfg


class EveryTurnCalls(Plain):
    """The ``plain`` format, reading one calculator call in every finished turn (a random model writes none)."""

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall("calculate", {"expression": EXPRESSION})]


class EveryTurnCallsHermes(Hermes):
    """The ``hermes`` format (results through the chat template), reading one calculator call in every finished turn."""

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall("calculate", {"expression": EXPRESSION})]


BENCH_FORMATS = {"plain": EveryTurnCalls(), "hermes": EveryTurnCallsHermes()}
TOOL_MESSAGE = {"role": "tool", "name": "calculate", "content": "42"}  # the calculator's answer to EXPRESSION


class BenchEpisodes(EpisodeSampler):
    """Episodes whose cut turns are closed as the model closes its own: with a chat template, the
    end-of-turn token goes in before the template's tool message (it follows a turn that ended in it)."""

    def _inserted_ids(self, calls, results) -> list[int]:
        return self.closing() + super()._inserted_ids(calls, results)

    def closing(self) -> list[int]:
        return [self.tokenizer.eos_token_id] if self.fmt.uses_chat_template else []

    def turn_insert(self) -> list[int]:
        """The ids inserted after every turn: the closing id, the calculator's result as the format renders it."""
        return self.closing() + self.renderer.suffix_ids([TOOL_MESSAGE])

    def prompt_len(self, prompt) -> int:
        """Ids of ``prompt`` as the episodes render it (with a chat template: the tools, the question)."""
        return len(self.renderer.prompt_ids([{"role": "user", "content": prompt.text}], self.envs().schemas))


class FixedTurns:
    """The engine with every turn cut at exactly ``turn_tokens`` sampled ids, the cut read as a
    finished turn ("stop"); no ``resume``, so the episode loop re-submits the conversation (naive)."""

    def __init__(self, engine, turn_tokens: int):
        self.engine, self.turn_tokens = engine, turn_tokens

    def submit(self, requests):
        return self.engine.submit([replace(r, params=replace(r.params, max_new_tokens=self.turn_tokens))
                                   for r in requests])

    def run_until(self, condition=None):
        done = self.engine.run_until(condition)
        return {h: replace(c, finish_reason="stop") for h, c in done.items()}


class KeptTurns(FixedTurns):
    """``FixedTurns`` with ``resume``: later turns continue from the kept cache."""

    def resume(self, states):
        return self.engine.resume([replace(s, params=replace(s.params, max_new_tokens=len(s.token_ids)
                                                             + self.turn_tokens)) for s in states])


def bench_prompts(cfg: MultiturnBenchConfig) -> list:
    """``num_prompts`` arith prompts, each after the same ``shots`` worked examples."""
    from rollwise.tasks.arith import build as build_arith
    from rollwise.types import Prompt

    task = build_arith(cfg.seed)
    shots = "".join(p.text + task.demonstrate(p) + "\n" for p in map(task.train.get, range(1, 1 + cfg.shots)))
    return [Prompt(f"q{i}", shots + task.train.get(cfg.shots + 1 + i).text) for i in range(cfg.num_prompts)]


def _sampler(cfg: MultiturnBenchConfig, tok, fmt, turns: int, inserted: int = 0) -> BenchEpisodes:
    from rollwise.engine.sampling import SamplingParams
    from rollwise.tasks.environment import EpisodeEnv, load_environment

    env = load_environment("calculator")
    # the episode's token budget: every turn's ids and the results between them, never reached
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=turns * (cfg.turn_tokens + inserted))
    return BenchEpisodes(params, tok, lambda: EpisodeEnv(env(), 5.0, 2000), fmt, max_turns=turns)


def _run_arm(cfg, engine, zero_stats, wrap, sampler, prompts) -> tuple[tuple[float, float], dict, list[list[int]]]:
    """One timed ``generate`` of every episode: (wall, CPU) seconds, the engine's counters, completion ids.
    The process's CPU time is what the run cost; on a machine shared with other jobs wall time is mostly load."""
    engine.stats = copy.deepcopy(zero_stats)  # this run's counters only
    start, cpu = time.perf_counter(), time.process_time()
    groups, _ = sampler.generate(wrap(engine, cfg.turn_tokens), prompts, [cfg.episodes] * len(prompts), cfg.seed)
    seconds = (time.perf_counter() - start, time.process_time() - cpu)
    return seconds, engine.stats.as_dict(), [r.completion_ids for g in groups for r in g.rollouts]


def _check(cfg, turns: int, inserted: list[int], completions: dict, stats: dict) -> None:
    """The arms did the same episodes, and what the kept arm restored the naive arm computed (or shared)."""
    if completions["kept"] != completions["naive"]:
        raise RuntimeError(f"max_turns={turns}: the arms sampled different completions (same seeds should give "
                           "the same ids)")
    n, want = len(inserted), turns * cfg.turn_tokens + (turns - 1) * len(inserted)
    ends = [k * (cfg.turn_tokens + n) + cfg.turn_tokens for k in range(turns - 1)]  # where each turn's ids end
    if any(len(c) != want or any(c[e:e + n] != inserted for e in ends) for c in completions["kept"]):
        raise RuntimeError(f"max_turns={turns}: an episode did not run {turns} turns of {cfg.turn_tokens} ids "
                           f"with the {n} result ids after each ({want} ids)")
    # every position of every turn's ids is computed (prefill), copied from a batch-mate's equal prefix
    # (prefix_tokens_shared) or, kept, restored from the last turn's cache: the same total in both arms
    placed = {a: stats[a]["prefill_tokens"] + stats[a]["prefix_tokens_shared"] + stats[a]["restored_tokens"]
              for a in ARMS}
    if placed["kept"] != placed["naive"] or stats["naive"]["restored_tokens"]:
        raise RuntimeError(f"max_turns={turns}: the arms placed {placed} positions (prefilled, shared or restored): "
                           "the counts do not add up")


def _arm_result(n: int, seconds: list[float], cpu_seconds: list[float], stats: dict) -> dict:
    return {"episodes_s": statistics.median(n / s for s in seconds),
            "episodes_cpu_s": statistics.median(n / s for s in cpu_seconds),
            "prefill_per_episode": stats["prefill_tokens"] / n,
            "restored_per_episode": stats["restored_tokens"] / n,
            "shared_per_episode": stats["prefix_tokens_shared"] / n,
            "decode_per_episode": stats["decode_tokens"] / n,
            "seconds": seconds, "cpu_seconds": cpu_seconds, "stats": stats}


def bench_turns(cfg: MultiturnBenchConfig, engine, tok, fmt, prompts, turns: int, status) -> dict:
    """One side-by-side measurement at ``max_turns=turns``."""
    inserted = _sampler(cfg, tok, fmt, turns).turn_insert()
    sampler = _sampler(cfg, tok, fmt, turns, len(inserted))
    longest = max(map(sampler.prompt_len, prompts)) + sampler.params.max_new_tokens
    if longest > engine.max_len:
        raise ConfigError(f"max_turns={turns}: the prompt and {turns} turns of {cfg.turn_tokens} ids with the "
                          f"results reach {longest} positions, over the model's {engine.max_len}; lower "
                          "turn_tokens, shots or max_turns")
    zero_stats = copy.deepcopy(engine.stats)
    wraps = {"kept": KeptTurns, "naive": FixedTurns}
    seconds, cpu, stats, completions = {a: [] for a in ARMS}, {a: [] for a in ARMS}, {}, {}
    for arm in ARMS:
        status.update(f"max_turns={turns}: {arm}: warm-up")
        _run_arm(cfg, engine, zero_stats, wraps[arm], sampler, prompts)
    for r in range(cfg.repeats):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            status.update(f"max_turns={turns}: run {r + 1}/{cfg.repeats}: {arm}")
            (s, c), stats[arm], completions[arm] = _run_arm(cfg, engine, zero_stats, wraps[arm], sampler, prompts)
            seconds[arm].append(s)
            cpu[arm].append(c)
        _check(cfg, turns, inserted, completions, stats)
    engine.stats = zero_stats
    n = len(prompts) * cfg.episodes
    arms = {a: _arm_result(n, seconds[a], cpu[a], stats[a]) for a in ARMS}
    paired = lambda t: statistics.median(b / a for a, b in zip(t["kept"], t["naive"]))  # noqa: E731
    return {**arms, "episodes": n, "inserted_per_turn": len(inserted),
            "prefill_ratio": arms["naive"]["prefill_per_episode"] / arms["kept"]["prefill_per_episode"],
            "time_ratio_paired": paired(seconds), "cpu_ratio_paired": paired(cpu),
            "same_completions": True}


def run_multiturn_bench(overrides: list[str], console) -> dict:
    """Episodes with the KV kept across turns vs re-prefilled each turn; print the table, return the results.

    Returns ``{"turns": {"T": {"kept": ARM, "naive": ARM, "prefill_ratio", "time_ratio_paired",
    "cpu_ratio_paired", ...}},
    "model", "tool_format", "inserted_text", "prompt_tokens", "params", "torch_threads", "settings"}`` with
    ``ARM = {"episodes_s", "episodes_cpu_s", "prefill_per_episode", "restored_per_episode",
    "decode_per_episode", "seconds", "cpu_seconds", "stats"}`` (``episodes_cpu_s``: per CPU second of this
    process). The ratios are naive / kept (above 1: keeping the cache saves that much)."""
    cfg = load_bench_config(overrides)
    with session(cfg.threads):
        return _run(cfg, console)


def _load(cfg: MultiturnBenchConfig):
    """(engine, tokenizer, params): the tiny preset, or ``model`` through the training loader on the slot engine."""
    from rollwise.engine.llama import UnsupportedModelError
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    if cfg.model is None:
        model, tok = build_tiny(cfg.preset, seed=cfg.seed)
    else:
        from rollwise.bench.chat import load_chat_model

        try:
            model, tok = load_chat_model(cfg.model, seed=cfg.seed)
        except ConfigError as err:  # the loader names model.path: here the setting is `model`
            raise ConfigError(f"config field 'model': {err}") from None
    model.eval()
    try:
        engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=cfg.batch_size, seed=cfg.seed)
    except UnsupportedModelError as err:
        raise ConfigError(f"config field 'model': {err}") from None
    return engine, tok, sum(p.numel() for p in model.parameters())


def _run(cfg: MultiturnBenchConfig, console) -> dict:
    from rollwise.tasks.tool_calls import tool_format

    with console.status(f"loading {cfg.model or cfg.preset}"):
        engine, tok, params_count = _load(cfg)
    fmt = BENCH_FORMATS[tool_format("auto", tok).name]  # the format training picks for this tokenizer
    prompts = bench_prompts(cfg)
    probe = _sampler(cfg, tok, fmt, 2)
    results = {}
    with console.status("multi-turn episodes") as status:
        for turns in cfg.max_turns:
            results[str(turns)] = bench_turns(cfg, engine, tok, fmt, prompts, turns, status)
    name = cfg.model or cfg.preset
    _print_table(console, cfg, f"{Path(name).name} ({params_count:,} params, {fmt.name})", results)
    return {"turns": results, "model": name, "tool_format": fmt.name,
            "inserted_text": tok.decode(probe.turn_insert()),
            "prompt_tokens": statistics.mean(map(probe.prompt_len, prompts)),
            "params": params_count, "torch_threads": torch.get_num_threads(), "settings": cfg.model_dump()}


def _print_table(console, cfg, model: str, results: dict) -> None:
    rows = []
    for turns, r in results.items():
        kept, naive = r["kept"], r["naive"]
        rows.append([turns, f"{kept['prefill_per_episode']:,.0f}", f"{naive['prefill_per_episode']:,.0f}",
                     f"{r['prefill_ratio']:.2f}x", f"{kept['restored_per_episode']:,.0f}",
                     f"{naive['shared_per_episode']:,.0f}",
                     f"{kept['episodes_s']:.1f}", f"{naive['episodes_s']:.1f}", f"{r['time_ratio_paired']:.2f}x",
                     f"{r['cpu_ratio_paired']:.2f}x"])
    console.print(table(
        f"multi-turn episodes, KV kept vs re-prefilled (naive) — {model}, "
        f"{cfg.num_prompts} prompts × {cfg.episodes} episodes, {cfg.turn_tokens} ids per turn, "
        f"median of {cfg.repeats}",
        ("turns", "prefill/ep kept", "prefill/ep naive", "naive/kept", "restored/ep kept", "shared/ep naive",
         "ep/s kept", "ep/s naive", "time naive/kept", "CPU naive/kept"),
        rows))
