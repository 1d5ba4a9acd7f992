"""``rollwise bench multiturn``: multi-turn episodes with the KV cache kept across turns vs the
conversation re-prefilled every turn (the naive harness), side by side (issue 24).

Both arms run ``generate/episode.py``'s ``EpisodeSampler`` on one ``SlotEngine`` (a tiny preset,
random init), the same prompts, seeds and settings, in the same process, alternating (kept,
naive, then naive, kept, ...) so that drift in machine load hits both:

- ``kept``: the engine as it is. A finished turn keeps its cached keys/values
  (``SamplingParams.keep_cache``) and the next turn ``resume``s from them: only the last sampled
  id and the inserted tool result are prefilled (``stats.restored_tokens`` are copied back).
- ``naive``: the same engine seen through a wrapper without ``resume``, so the episode loop
  submits prompt + conversation so far as a new prompt every turn, as a harness that calls a
  plain generate endpoint per turn does.

What is measured is the engine work of a fixed number of turns, not a policy. A random tiny model
never writes a tool call itself, so the tool format reads a ``calculate("6*7")`` call in every
finished turn (as ``AlwaysCall`` does in tests/test_episodes.py), and the built-in ``calculator``
environment answers it (``<result>42</result>``, inserted as ids). EOS is off and every turn is
cut at exactly ``turn_tokens`` sampled ids (a wrapper sets each turn's ``max_new_tokens`` and
reads the cut as a finished turn), so every episode runs ``max_turns`` turns of equal length in
both arms. Both arms sample with the same per-turn seeds, so they sample the same tokens: the
bench checks that their completion ids are identical, and that what the naive arm prefills
beyond the kept one is exactly what the kept arm restored.

Prompts: ``num_prompts`` arith prompts, each after ``shots`` worked examples (~50 tokens each: real
agent prompts carry instructions), ``episodes`` episodes per prompt, all in one engine wave
(``batch_size`` slots). Per arm: prefill and restored tokens per episode (engine counters over
the run), episodes/s (median over ``repeats``); paired: naive/kept seconds (median over adjacent
pairs) and naive/kept prefill tokens. ``max_turns`` is a list: one side-by-side measurement
per conversation length (the naive arm's prefill grows with the square of the turns, the kept
arm's linearly). Each arm gets one untimed warm-up per length. Timed regions are whole
``generate`` calls (environment calls and tokenizer work included, the same in both arms).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import replace

import torch
from pydantic import Field

from rollwise.bench.harness import load_settings, session, table
from rollwise.config import ConfigError, StrictModel
from rollwise.tasks.tool_calls import Plain, ToolCall

EXPRESSION = "6*7"  # what every turn asks the calculator
ARMS = ("kept", "naive")


class MultiturnBenchConfig(StrictModel):
    """Settings of ``rollwise bench multiturn`` (override with ``--set key=value``)."""

    preset: str = Field("small", description="tiny model preset (random init)")
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
    if cfg.preset not in PRESETS:
        raise ConfigError(f"config field 'preset': unknown preset '{cfg.preset}'; choose from {sorted(PRESETS)}")
    if min(cfg.max_turns) < 2:
        raise ConfigError("config field 'max_turns': every value must be >= 2 (one turn has nothing to keep)")
    return cfg


class EveryTurnCalls(Plain):
    """The ``plain`` format, reading one calculator call in every finished turn (a random model writes none)."""

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall("calculate", {"expression": EXPRESSION})]


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


def _sampler(cfg: MultiturnBenchConfig, tok, turns: int, inserted: int):
    from rollwise.engine.sampling import SamplingParams
    from rollwise.generate.episode import EpisodeSampler
    from rollwise.tasks.environment import EpisodeEnv, load_environment

    env = load_environment("calculator")
    # the episode's token budget: every turn's ids and the results between them, never reached
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=turns * (cfg.turn_tokens + inserted))
    return EpisodeSampler(params, tok, lambda: EpisodeEnv(env(), 5.0, 2000), EveryTurnCalls(), max_turns=turns)


def _run_arm(cfg, engine, zero_stats, wrap, sampler, prompts) -> tuple[float, dict, list[list[int]]]:
    """One timed ``generate`` of every episode: seconds, the engine's counters, completion ids."""
    engine.stats = copy.deepcopy(zero_stats)  # this run's counters only
    start = time.perf_counter()
    groups, _ = sampler.generate(wrap(engine, cfg.turn_tokens), prompts, [cfg.episodes] * len(prompts), cfg.seed)
    seconds = time.perf_counter() - start
    return seconds, engine.stats.as_dict(), [r.completion_ids for g in groups for r in g.rollouts]


def _check(cfg, turns: int, inserted: int, completions: dict, stats: dict) -> None:
    """The arms did the same episodes, and what the kept arm restored the naive arm computed (or shared)."""
    if completions["kept"] != completions["naive"]:
        raise RuntimeError(f"max_turns={turns}: the arms sampled different completions (same seeds should give "
                           "the same ids)")
    want = turns * cfg.turn_tokens + (turns - 1) * inserted
    if any(len(c) != want for c in completions["kept"]):
        raise RuntimeError(f"max_turns={turns}: an episode did not run {turns} turns of {cfg.turn_tokens} ids "
                           f"({want} ids with the results)")
    # every position of every turn's ids is computed (prefill), copied from a batch-mate's equal prefix
    # (prefix_tokens_shared) or, kept, restored from the last turn's cache: the same total in both arms
    placed = {a: stats[a]["prefill_tokens"] + stats[a]["prefix_tokens_shared"] + stats[a]["restored_tokens"]
              for a in ARMS}
    if placed["kept"] != placed["naive"] or stats["naive"]["restored_tokens"]:
        raise RuntimeError(f"max_turns={turns}: the arms placed {placed} positions (prefilled, shared or restored): "
                           "the counts do not add up")


def _arm_result(n: int, seconds: list[float], stats: dict) -> dict:
    return {"episodes_s": statistics.median(n / s for s in seconds),
            "prefill_per_episode": stats["prefill_tokens"] / n,
            "restored_per_episode": stats["restored_tokens"] / n,
            "shared_per_episode": stats["prefix_tokens_shared"] / n,
            "decode_per_episode": stats["decode_tokens"] / n,
            "seconds": seconds, "stats": stats}


def bench_turns(cfg: MultiturnBenchConfig, engine, tok, prompts, turns: int, status) -> dict:
    """One side-by-side measurement at ``max_turns=turns``."""
    inserted = len(tok(EveryTurnCalls().result_text(["42"]), add_special_tokens=False)["input_ids"])
    sampler = _sampler(cfg, tok, turns, inserted)
    longest = max(len(tok(p.text)["input_ids"]) for p in prompts) + sampler.params.max_new_tokens
    if longest > engine.max_len:
        raise ConfigError(f"max_turns={turns}: the prompt and {turns} turns of {cfg.turn_tokens} ids with the "
                          f"results reach {longest} positions, over the model's {engine.max_len}; lower "
                          "turn_tokens, shots or max_turns")
    zero_stats = copy.deepcopy(engine.stats)
    wraps = {"kept": KeptTurns, "naive": FixedTurns}
    seconds, stats, completions = {a: [] for a in ARMS}, {}, {}
    for arm in ARMS:
        status.update(f"max_turns={turns}: {arm}: warm-up")
        _run_arm(cfg, engine, zero_stats, wraps[arm], sampler, prompts)
    for r in range(cfg.repeats):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            status.update(f"max_turns={turns}: run {r + 1}/{cfg.repeats}: {arm}")
            s, stats[arm], completions[arm] = _run_arm(cfg, engine, zero_stats, wraps[arm], sampler, prompts)
            seconds[arm].append(s)
        _check(cfg, turns, inserted, completions, stats)
    engine.stats = zero_stats
    n = len(prompts) * cfg.episodes
    arms = {a: _arm_result(n, seconds[a], stats[a]) for a in ARMS}
    return {**arms, "episodes": n, "inserted_per_turn": inserted,
            "prefill_ratio": arms["naive"]["prefill_per_episode"] / arms["kept"]["prefill_per_episode"],
            "time_ratio_paired": statistics.median(b / a for a, b in zip(seconds["kept"], seconds["naive"])),
            "same_completions": True}


def run_multiturn_bench(overrides: list[str], console) -> dict:
    """Episodes with the KV kept across turns vs re-prefilled each turn; print the table, return the results.

    Returns ``{"turns": {"T": {"kept": ARM, "naive": ARM, "prefill_ratio", "time_ratio_paired", ...}},
    "params", "torch_threads", "settings"}`` with ``ARM = {"episodes_s", "prefill_per_episode",
    "restored_per_episode", "decode_per_episode", "seconds", "stats"}``. Both ratios are naive / kept
    (above 1: keeping the cache saves that much)."""
    cfg = load_bench_config(overrides)
    with session(cfg.threads):
        return _run(cfg, console)


def _run(cfg: MultiturnBenchConfig, console) -> dict:
    from rollwise.engine.slots import SlotEngine
    from rollwise.model.tiny import build_tiny

    model, tok = build_tiny(cfg.preset, seed=cfg.seed)
    model.eval()
    params_count = sum(p.numel() for p in model.parameters())
    engine = SlotEngine(model, pad_token_id=tok.pad_token_id, max_batch_size=cfg.batch_size, seed=cfg.seed)
    prompts = bench_prompts(cfg)
    results = {}
    with console.status("multi-turn episodes") as status:
        for turns in cfg.max_turns:
            results[str(turns)] = bench_turns(cfg, engine, tok, prompts, turns, status)
    _print_table(console, cfg, params_count, results)
    return {"turns": results, "params": params_count, "torch_threads": torch.get_num_threads(),
            "settings": cfg.model_dump()}


def _print_table(console, cfg, params_count: int, results: dict) -> None:
    rows = []
    for turns, r in results.items():
        kept, naive = r["kept"], r["naive"]
        rows.append([turns, f"{kept['prefill_per_episode']:,.0f}", f"{naive['prefill_per_episode']:,.0f}",
                     f"{r['prefill_ratio']:.2f}x", f"{kept['restored_per_episode']:,.0f}",
                     f"{naive['shared_per_episode']:,.0f}",
                     f"{kept['episodes_s']:.1f}", f"{naive['episodes_s']:.1f}", f"{r['time_ratio_paired']:.2f}x"])
    console.print(table(
        f"multi-turn episodes, KV kept vs re-prefilled (naive) — {cfg.preset} ({params_count:,} params), "
        f"{cfg.num_prompts} prompts × {cfg.episodes} episodes, {cfg.turn_tokens} ids per turn, "
        f"median of {cfg.repeats}",
        ("turns", "prefill/ep kept", "prefill/ep naive", "naive/kept", "restored/ep kept", "shared/ep naive",
         "ep/s kept", "ep/s naive", "time naive/kept"),
        rows))
