"""What every bench shares: settings, a session, the SFT warm start, recorded training runs, the
noise floor, results JSON and tables.

A training bench is the same few moves on rollwise's public API (``load_run_config``, ``Trainer``:
``prepare``, ``fit``, ``state``):

1. its settings, a ``StrictModel`` read from ``--set`` lines (``load_settings``);
2. a ``session``: transformers quiet, the caller's RNG state untouched, torch at the bench's
   thread count (restored after), a scratch directory;
3. one SFT ``warm_start`` every arm starts from;
4. per seed and arm (``grid``), a ``train_run`` of config lines — ``rl_sets`` (GRPO from the warm
   start, no checkpoints or samples), the arm's lines, the seed's (``seed_sets``: the noise floor
   is the baseline with other rollout-sampling seeds) — recorded as a ``Run``: each eval's
   accuracy and per-prompt correctness, each step's generated tokens and mean reward;
5. each arm against its baseline, paired by seed and prompt (``rollwise.bench.compare``), written
   as JSON (``write_json``) and printed as a ``table``.

Nothing here knows an arm: the benches say what their arms are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from rich.table import Table

from rollwise.bench.stats import correct_string
from rollwise.config import StrictModel, apply_overrides, validate
from rollwise.report.runs import read_jsonl

NOISE_FLOOR = "noise_floor"  # the baseline again, sampling with sampling_seed = seed + NOISE_SEED_OFFSET
NOISE_SEED_OFFSET = 1_000


# -- settings ----------------------------------------------------------------------------------
def load_settings(model, overrides: list[str], defaults: dict | None = None):
    """A bench's settings: ``defaults`` (none: the model's own), then the ``--set`` lines."""
    return validate(model, apply_overrides(dict(defaults or {}), list(overrides)))


class GrpoBenchConfig(StrictModel):
    """The settings every learning bench shares: GRPO from one SFT warm start of a tiny preset,
    ``seeds`` per arm, greedy accuracy on ``eval_size`` held-out prompts every ``eval_every`` steps."""

    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="RL seeds per arm (the verdict's unit)")
    preset: str = Field("tiny", description="model preset (random init, then SFT)")
    sft_steps: int = Field(500, ge=0, description="SFT warm-start steps (per task)")
    num_generations: int = Field(8, ge=2, description="rollouts per prompt (the budget per prompt)")
    prompts_per_step: int = Field(16, ge=1, description="groups per step")
    lr: float = Field(3e-5, gt=0, description="GRPO learning rate")
    eval_every: int = Field(4, ge=1, description="evaluate every N steps (and at the end)")
    eval_size: int = Field(200, ge=1, description="held-out prompts for greedy accuracy")


class TaskBenchConfig(GrpoBenchConfig):
    """The learning benches on ``arith`` and ``countdown`` to a generated-token budget per run
    (``bench control``, ``bench ablate``)."""

    tasks: list[Literal["arith", "countdown"]] = Field(["arith", "countdown"], min_length=1, description="tasks")
    noise_floor: bool = Field(True, description="also run the baseline with other sampling seeds, judged by the same "
                              "rule: it must read 'no detectable difference'")
    threads: int = Field(1, ge=0, description="torch threads (0 = torch's default)")
    tokens: int = Field(100_000, ge=1, description="arith: generated-token budget of every run")
    countdown_tokens: int = Field(80_000, ge=1, description="countdown: generated-token budget of every run")
    arith_max_digits: int = Field(5, ge=1, description="arith: operand digits up to this (the demo's mix)")
    arith_max_new_tokens: int = Field(96, ge=1, description="arith completion limit")
    countdown_max_new_tokens: int = Field(32, ge=1, description="countdown completion limit")
    countdown_max_numbers: int = Field(3, ge=3, le=6, description="countdown: most numbers given per prompt (3: the "
                                       "tiny model learns from 19% within the budget; with 4 it does not)")

    def budget(self, task: str) -> int:
        return self.tokens if task == "arith" else self.countdown_tokens


def task_sets(cfg: TaskBenchConfig, task: str) -> list[str]:
    """The config lines of ``task`` at a bench's settings."""
    if task == "arith":
        return ["task.name=arith", f"task.max_digits={cfg.arith_max_digits}", f"task.eval_size={cfg.eval_size}",
                f"rollout.max_new_tokens={cfg.arith_max_new_tokens}"]
    return ["task.name=countdown", f"task.eval_size={cfg.eval_size}", "task.min_numbers=3",
            f"task.max_numbers={cfg.countdown_max_numbers}",
            f"rollout.max_new_tokens={cfg.countdown_max_new_tokens}"]


# -- a session ---------------------------------------------------------------------------------
@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' logging, its progress bars and Python warnings (restored after)."""
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights" bars would scroll the bench's own status away
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(old)
        hf_logging.enable_progress_bar()


@contextmanager
def session(threads: int = 0) -> Iterator[Path]:
    """A bench's session: transformers quiet, the global RNGs forked (the caller's state comes back),
    torch at ``threads`` (0 = as it is; restored after); yields a scratch directory."""
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with quiet_transformers(), torch.random.fork_rng(), tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    finally:
        torch.set_num_threads(saved)


def in_child(function: str, args: dict) -> dict:
    """``module:function(**args)`` called in a fresh interpreter (peak memory is per process); its
    JSON result (the last line it prints)."""
    module, name = function.split(":")
    code = f"import json; from {module} import {name}; print(json.dumps({name}(**json.loads({json.dumps(args)!r}))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{function} failed in a fresh process:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- runs --------------------------------------------------------------------------------------
def threads_set() -> str:
    """The config line that keeps a run at this process's torch thread count."""
    return f"model.threads={torch.get_num_threads()}"


def warm_start(out: Path, name: str, sets: list[str], console, recipe: str | None = None) -> Path:
    """The SFT warm start: a run of ``sets`` (with ``sft.*``) that takes no RL step, in ``out/name``;
    returns the directory of the weights it ends with (the arms' ``model.path``)."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    with console.status(f"{name}: SFT warm start"):
        with Trainer(load_run_config(recipe, [f"output_dir={out}", f"name={name}", *sets, "train.steps=0"])) as t:
            t.prepare(overwrite=True)  # a killed bench (ablate) makes its unfinished warm start again
    return t.init_model_dir()


def task_warm_start(cfg: TaskBenchConfig, task: str, out: Path, console) -> Path:
    """The SFT warm start of ``task`` (seed 0) every arm of a task bench starts from, in ``out/warm_<task>``."""
    return warm_start(out, f"warm_{task}", ["seed=0", f"model.preset={cfg.preset}", *task_sets(cfg, task),
                                            f"sft.steps={cfg.sft_steps}", threads_set()], console)


def rl_sets(cfg: GrpoBenchConfig, out: Path, name: str, seed: int, warm: Path, eval_every: int,
            steps: int = 100_000) -> list[str]:
    """The lines every learning bench's RL run shares: from the warm start, ``cfg``'s groups
    (``num_generations``, ``prompts_per_step``) and ``lr``, evaluated every ``eval_every`` steps,
    no checkpoints, no logged samples (a token budget, not ``steps``, usually stops it)."""
    return [*run_sets(out, name, seed, eval_every, steps), f"model.path={warm}", "sft.steps=0",
            f"rollout.num_generations={cfg.num_generations}", f"rollout.prompts_per_step={cfg.prompts_per_step}",
            f"optim.lr={cfg.lr}", "optim.micro_batch_size=128"]


def run_sets(out: Path, name: str, seed: int, eval_every: int, steps: int = 100_000) -> list[str]:
    """The lines of any recorded bench run: where it writes, its seed, evaluated every ``eval_every``
    steps, no checkpoints, no logged samples (a token budget, not ``steps``, usually stops it)."""
    return [f"output_dir={out}", f"name={name}", f"seed={seed}", f"train.steps={steps}",
            f"train.eval_every={eval_every}", "train.eval_samples=0", "train.log_samples=0",
            "train.checkpoint_every=0"]


def seed_sets(arm: str, seed: int) -> list[str]:
    """The lines of an arm's run on ``seed``: the noise floor samples with other seeds (same data order,
    warm start and eval set)."""
    return [f"seed={seed}", *([f"sampling_seed={seed + NOISE_SEED_OFFSET}"] if arm == NOISE_FLOOR else [])]


def grid(seeds: list[int], arms: list[str], rotate: bool = False) -> Iterator[tuple[int, str]]:
    """(seed, arm) in run order: every arm for the first seed, then the next; ``rotate`` starts each
    seed one arm later, so drift on a shared machine spreads over every arm.

    >>> list(grid([0, 1], ["a", "b"], rotate=True))
    [(0, 'a'), (0, 'b'), (1, 'b'), (1, 'a')]
    """
    for i, seed in enumerate(seeds):
        k = i % len(arms) if rotate else 0
        for arm in arms[k:] + arms[:k]:
            yield seed, arm


@dataclass
class Run:
    """One recorded training run."""

    summary: dict  # what Trainer.fit returns (summary.json)
    evals: list[dict]  # per eval: step, wall (RL seconds), tokens (generated so far), accuracy, correct ('0'/'1')
    trace: list[list]  # per step: [tokens/generated, reward/mean] — what departure_step compares
    steps: list[dict]  # per step: the metrics train_run's ``keep`` selects

    @property
    def curve(self) -> list[tuple[int, float]]:
        """(generated tokens, accuracy) at each eval."""
        return [(e["tokens"], e["accuracy"]) for e in self.evals]

    def record(self, seed: int) -> dict:
        """The fields every bench keeps of a run."""
        s = self.summary
        return {"seed": seed, "final_accuracy": s["final_accuracy"], "initial_accuracy": s["initial_accuracy"],
                "generated_tokens": s["generated_tokens"], "wall_seconds": s["wall_seconds"], "trace": self.trace,
                "computed_on": computed_on(s)}


def computed_on(summary: dict) -> str | None:
    """Where and in which precision a run computed, from its ``summary.json`` (None: it recorded
    neither) — what a ledger groups its runs by, since runs on CPUs of other instruction sets, or in
    another precision, are not one computation.

    >>> computed_on({"cpu": {"model": "AMD EPYC", "flags": ["avx2"], "native_bf16": False},
    ...              "engine_dtype": "float32", "compute_dtype": "float32"})
    'AMD EPYC (AVX2), sampling float32, update float32'
    >>> computed_on({"cpu": {"model": "Xeon", "flags": ["avx2", "avx512_bf16", "avx512f"], "native_bf16": True}})
    'Xeon (AVX-512, native bf16)'
    """
    cpu, parts = summary.get("cpu"), []
    if isinstance(cpu, dict):
        flags = set(cpu.get("flags", []))
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
        parts.append(f"{cpu.get('model', '?')} ({isa}{', native bf16' if cpu.get('native_bf16') else ''})")
    parts += [f"{what} {summary[key]}" for what, key in (("sampling", "engine_dtype"), ("update", "compute_dtype"))
              if summary.get(key)]
    return ", ".join(parts) or None


def train_run(sets: list[str], console, label: str, tokens: int | None = None, keep: tuple[str, ...] = (),
              recipe: str | None = None, checkpoint_every: int = 0) -> Run:
    """Train one run of ``sets`` (after ``recipe``, if any) until the engine has sampled ``tokens``
    tokens (None: the config's own ``train`` limits), showing ``label`` and the progress.
    ``keep``: the step metrics to record, by name or by prefix (ending in ``/``).

    ``checkpoint_every`` > 0: the run checkpoints every that many steps (the last checkpoint kept) and
    a run directory holding one resumes from it — a long bench killed mid-run loses at most that many
    steps; the record is then read back from the run directory (``history``), the same as uninterrupted.
    0: a killed run starts again in place."""
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer
    from rollwise.train.state import RunLimits

    prefixes = tuple(k for k in keep if k.endswith("/"))
    if checkpoint_every:
        sets = [*sets, f"train.checkpoint_every={checkpoint_every}", "train.keep_checkpoints=1"]
    evals, trace, steps = [], [], []
    with console.status(label) as status, Trainer(load_run_config(recipe, sets)) as trainer:
        resume = checkpoint_every > 0 and any((trainer.run_dir / "checkpoints").glob("step_*"))
        trainer.prepare(resume=resume, overwrite=not resume)  # else a killed bench runs its arm again in place
        state = trainer.state

        def on_eval(step: int, result) -> None:
            evals.append({"step": step, "wall": state.wall_seconds, "tokens": state.generated_tokens,
                          "accuracy": result.accuracy, "correct": correct_string(result.correct)})

        def on_step(step: int, metrics: dict) -> None:
            steps.append({k: v for k, v in metrics.items() if k.startswith(prefixes) or k in keep})
            trace.append([metrics.get("tokens/generated"), metrics.get("reward/mean")])
            budget = f"/{tokens:,}" if tokens else ""
            status.update(f"{label}, step {step}, {state.generated_tokens:,}{budget} tokens")

        limits = RunLimits(generated_tokens=tokens) if tokens else None
        summary = trainer.fit(limits, on_step=on_step, on_eval=on_eval)
    if checkpoint_every:
        evals, trace, steps = history(trainer.run_dir, keep)
    # a bench keeps its records, not weights: fit's final checkpoint (1.6 GB for SmolLM2-135M) goes
    shutil.rmtree(trainer.run_dir / "checkpoints", ignore_errors=True)
    return Run(summary, evals, trace, steps)


def history(run_dir: Path, keep: tuple[str, ...] = ()) -> tuple[list[dict], list[list], list[dict]]:
    """A run's evals, trace and kept step metrics as ``train_run`` records them, read from its
    ``metrics.jsonl`` and ``evals.jsonl`` (which a resumed run continues): an eval's ``tokens`` are the
    generated tokens after its step, its ``wall`` the RL step seconds up to it."""
    prefixes = tuple(k for k in keep if k.endswith("/"))
    rows = read_jsonl(run_dir / "metrics.jsonl")
    correct = {e["step"]: e["correct"] for e in read_jsonl(run_dir / "evals.jsonl")}
    evals, trace, steps, tokens, wall = [], [], [], 0, 0.0
    for row in rows:
        if "eval/accuracy" in row:
            evals.append({"step": row["step"], "wall": wall, "tokens": tokens, "accuracy": row["eval/accuracy"],
                          "correct": correct.get(row["step"])})
        elif "tokens/total" in row:
            tokens, wall = int(row["tokens/total"]), wall + row.get("time/step", 0.0)
            trace.append([row.get("tokens/generated"), row.get("reward/mean")])
            steps.append({k: v for k, v in row.items() if k != "step" and (k.startswith(prefixes) or k in keep)})
    return evals, trace, steps


# -- output ------------------------------------------------------------------------------------
def write_json(path: Path | None, results: dict) -> None:
    """Write ``results`` to ``--json`` (nothing without one); a long bench calls it after every run.
    Every benchmark JSON records the machine it ran on (``cpu``: ``rollwise.hardware.cpu_record``)."""
    if path is not None:
        if isinstance(results, dict) and "cpu" not in results:
            from rollwise.hardware import cpu_record

            results = {"cpu": cpu_record(), **results}
        Path(path).write_text(json.dumps(results, indent=2))


def table(title: str, columns: tuple[str, ...], rows: list[list[str]], left: tuple[str, ...] = ()) -> Table:
    """A results table: the first column and those in ``left`` flush left, numbers flush right."""
    t = Table(title=title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 or col in left else "right")
    for row in rows:
        t.add_row(*row)
    return t
