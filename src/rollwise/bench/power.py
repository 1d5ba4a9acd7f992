"""How many seeds and eval prompts a ledger needs to see an effect: the power of ``bench/stats.py``'s
paired rule, by simulation (issue 37: "power first").

**Model.** On seed ``s`` an arm and its baseline are graded on the same ``m`` prompts; the per-seed
difference is ``D_s = Δ + u_s + mean_p e_sp``: ``u_s`` the training noise of two runs (sd
``sd_seed``: one trained model is better than another on every prompt at once), ``e_sp`` the
per-prompt paired differences around it (sd ``sd_prompt``, ~0.3–0.5 for 0/1 correctness). So
``sd(D) = √(sd_seed² + sd_prompt² / m)``: more eval prompts shrink only the second term — past a
point, only more seeds help. The rule is the ledger's: the t interval over ``S`` seeds, its
standard error floored at the prompts' own (``sd_prompt / √(S m)``), "better"/"worse" when it
excludes 0.

**Estimates.** ``components`` reads ``sd_seed`` and ``sd_prompt`` from a pilot's paired per-seed
differences and per-prompt sd (the noise-floor row of a ledger is such a pilot: Δ = 0 by design).

**Power** is simulated (normal ``D_s``; a fixed generator seed, so a plan is reproducible), not
taken from the normal approximation, which overstates it at few seeds (t with S − 1 degrees of
freedom).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import Field

from rollwise.bench.stats import LEVEL, t_quantile
from rollwise.config import ConfigError, StrictModel


def components(seed_differences: Sequence[float], prompt_sd: float, prompts: int) -> tuple[float, float]:
    """(sd_seed, sd_prompt) from a pilot: the per-seed paired differences (fractions), the pooled
    within-seed sd of the per-prompt differences, and the prompts per seed.

    >>> components([0.04, -0.105, 0.04], prompt_sd=0.5, prompts=200)  # SmolLM2's short-ledger noise floor
    (0.0759, 0.5)
    """
    d = np.asarray(seed_differences, dtype=np.float64)
    if len(d) < 2:
        raise ValueError("components: at least two seeds' differences are needed for a spread")
    seed_var = max(float(d.var(ddof=1)) - prompt_sd ** 2 / prompts, 0.0)
    return round(math.sqrt(seed_var), 4), prompt_sd


def power(delta: float, sd_seed: float, sd_prompt: float, seeds: int, prompts: int, sims: int = 20_000,
          rng_seed: int = 0, level: float = LEVEL) -> float:
    """P(the paired rule gives a verdict) when the true effect is ``delta`` (a fraction: 0.05 = 5 points)."""
    if seeds < 2:
        return 0.0
    rng = np.random.default_rng(rng_seed)
    sd = math.sqrt(sd_seed ** 2 + sd_prompt ** 2 / prompts)
    d = delta + sd * rng.standard_normal((sims, seeds))
    floor = sd_prompt / math.sqrt(seeds * prompts)
    se = np.maximum(d.std(axis=1, ddof=1) / math.sqrt(seeds), floor)
    critical = t_quantile(0.5 + level / 2, seeds - 1)
    return float(np.mean(np.abs(d.mean(axis=1)) / se > critical))


def seeds_needed(delta: float, sd_seed: float, sd_prompt: float, prompts: int, target: float = 0.8,
                 max_seeds: int = 200, level: float = LEVEL) -> int | None:
    """The fewest seeds whose power for ``delta`` reaches ``target`` (None: not within ``max_seeds``)."""
    for seeds in range(2, max_seeds + 1):
        if power(delta, sd_seed, sd_prompt, seeds, prompts, level=level) >= target:
            return seeds
    return None


def minimal_effect(sd_seed: float, sd_prompt: float, seeds: int, prompts: int, target: float = 0.8,
                   level: float = LEVEL, tolerance: float = 1e-4) -> float | None:
    """The smallest effect (a fraction) the rule detects with power ``target`` at ``seeds`` and
    ``prompts`` — the ledger's minimal detectable effect — by bisection (the simulation's draws are
    fixed, so power rises with the effect); None when not even 50 points would be (< 2 seeds).

    >>> minimal_effect(0.0, 0.5, seeds=4, prompts=10_000) < 0.05 < minimal_effect(0.05, 0.5, seeds=4, prompts=1000)
    True
    """
    hi = 0.5
    if power(hi, sd_seed, sd_prompt, seeds, prompts, level=level) < target:
        return None
    lo = 0.0
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power(mid, sd_seed, sd_prompt, seeds, prompts, level=level) >= target else (mid, hi)
    return math.ceil(hi * 1e4) / 1e4  # rounded up: the power there still reaches the target


# -- rollwise bench power ----------------------------------------------------------------------------------------

class PowerBenchConfig(StrictModel):
    """Settings of ``rollwise bench power`` (override with ``--set key=value``)."""

    ledger: str = Field(..., description="a ledger's JSON (bench ablate --json): its pilot row gives the noise")
    task: str | None = Field(None, description="the ledger's task (None: its only task)")
    pilot: str = Field("noise_floor", description="the row read as the pilot (the noise floor: Δ = 0 by design)")
    delta: float = Field(0.05, gt=0, lt=1, description="the effect to detect, a fraction (0.05 = 5 points)")
    target: float = Field(0.8, gt=0, lt=1, description="the power wanted")
    prompts: list[int] = Field([200, 1000, 5000], min_length=1, description="eval prompts per seed to plan for")
    seeds: list[int] = Field([3, 5, 10, 20], min_length=1, description="seed counts whose power is shown")
    family: int = Field(1, ge=1, description="method arms read together: the power at α / family, Holm's first "
                        "step (a lone real effect among null arms), where a ledger claims wins family-wise")


def pilot_components(ledger: dict, task: str | None, pilot: str) -> tuple[float, float, int, list[float]]:
    """(sd_seed, sd_prompt, prompts per seed, the pilot's per-seed differences) from a ledger's JSON."""
    tasks = ledger["tasks"]
    if task is None:
        if len(tasks) != 1:
            raise ConfigError(f"config field 'task': the ledger has tasks {sorted(tasks)}; name one")
        task = next(iter(tasks))
    if task not in tasks:
        raise ConfigError(f"config field 'task': {task!r} is not in the ledger (it has {sorted(tasks)})")
    row = tasks[task].get(pilot)
    if row is None or len(row.get("seed_differences") or []) < 2:
        raise ConfigError(f"config field 'pilot': the ledger's {task} has no row {pilot!r} with two or more paired "
                          "seeds (run bench ablate with the noise floor and two seeds or more)")
    seeds, pairs = len(row["seed_differences"]), row["pairs"]
    prompts = pairs // seeds
    sd_prompt = row["prompt_se"] * math.sqrt(seeds * prompts)  # prompt_se = sd_prompt / √(S m) (bench/stats.py)
    sd_seed, sd_prompt = components(row["seed_differences"], sd_prompt, prompts)
    return sd_seed, sd_prompt, prompts, row["seed_differences"]


def run_power_bench(overrides: list[str], console) -> dict:
    """The power of the paired rule for ``delta`` at the pilot's noise: per eval size, the power at
    each seed count, the seeds needed for ``target``, and the smallest effect each seed count sees
    with ``target`` power."""
    from rollwise.bench.harness import load_settings, table

    cfg = load_settings(PowerBenchConfig, overrides)
    try:
        ledger = json.loads(Path(cfg.ledger).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"config field 'ledger': cannot read {cfg.ledger} ({err})") from None
    sd_seed, sd_prompt, pilot_prompts, diffs = pilot_components(ledger, cfg.task, cfg.pilot)
    alpha = (1 - LEVEL) / cfg.family
    rows = []
    for m in cfg.prompts:
        rows.append({"prompts": m, "power": {str(s): power(cfg.delta, sd_seed, sd_prompt, s, m, level=1 - alpha)
                                             for s in cfg.seeds},
                     "seeds_needed": seeds_needed(cfg.delta, sd_seed, sd_prompt, m, cfg.target, level=1 - alpha),
                     "minimal_effect": {str(s): minimal_effect(sd_seed, sd_prompt, s, m, cfg.target, level=1 - alpha)
                                        for s in cfg.seeds}})
    console.print(f"pilot {cfg.pilot}: per-seed differences {', '.join(f'{100 * d:+.1f}' for d in diffs)} points on "
                  f"{pilot_prompts} prompts → training noise sd {100 * sd_seed:.1f} points, per-prompt sd "
                  f"{sd_prompt:.3f} (estimated from {len(diffs)} seeds: itself uncertain)")
    family = "" if cfg.family == 1 else f" over {cfg.family} arms: Holm's first step"
    console.print(table(f"power to detect {100 * cfg.delta:.0f} points (α = {alpha:.3g}{family}, the paired rule)",
                        ("eval prompts", *(f"{s} seeds" for s in cfg.seeds), f"seeds for {cfg.target:.0%}"),
                        [[str(r["prompts"]), *(f"{r['power'][str(s)]:.0%}" for s in cfg.seeds),
                          str(r["seeds_needed"] or "> 200")] for r in rows]))
    console.print(table(f"the smallest effect seen with {cfg.target:.0%} power, in points (α = {alpha:.3g}{family})",
                        ("eval prompts", *(f"{s} seeds" for s in cfg.seeds)),
                        [[str(r["prompts"]), *("—" if r["minimal_effect"][str(s)] is None
                                               else f"{100 * r['minimal_effect'][str(s)]:.1f}" for s in cfg.seeds)]
                         for r in rows]))
    return {"settings": cfg.model_dump(), "pilot": {"seed_differences": diffs, "prompts": pilot_prompts,
                                                    "sd_seed": sd_seed, "sd_prompt": sd_prompt}, "plans": rows}
