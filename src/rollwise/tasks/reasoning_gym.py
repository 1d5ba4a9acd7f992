"""``reasoning_gym``: the reasoning-gym package's procedural generators as a task.

reasoning-gym (Stojanovski et al., 2025) generates verifiable problems (``chain_sum``,
``basic_arithmetic``, ``gsm_symbolic``, ``countdown``, ``leg_counting`` and ~100 more), each
scored by its dataset's own ``score_answer``; verl, TRL and open-instruct users train on it. A
recipe lists datasets with weights and each generator's own config (its difficulty knobs)::

    task:
      name: reasoning_gym
      datasets:
        - {name: chain_sum, config: {min_terms: 2, max_terms: 3, max_digits: 2}}
        - {name: leg_counting, weight: 0.5}

Prompts are conversational: ``messages`` = [system prompt, question + the answer-format
instruction] (the trainer applies the tokenizer's chat template; a tokenizer without one sees
``text``, the bare question). The verifier is ``rollwise.filter.reasoning_gym``.

``answer_format`` defaults to ``answer_tag``, reasoning-gym's own convention (its ``default``
system prompt, its ``extract_answer``): it is what the recipes training on reasoning-gym use, so
scores compare with theirs, and a tag holds any answer a dataset asks for (multi-line grids,
sets in braces, JSON), where ``\\boxed{}`` breaks on an unbalanced brace. ``boxed`` is the
better start for math-tuned chat models (Qwen2.5 and the like write ``\\boxed{}`` unprompted) on
numeric datasets.

Seeds, like reasoning-gym's ``ReseedingDataset``: a dataset's items are addressed by an
unbounded index, served from generators of ``CHUNK`` items seeded ``base + chunk * CHUNK``
(most generators seed item ``i`` with ``seed + i``, so index ``n`` is always ``base + n``);
``base`` is a function of (run seed, dataset position, name). Eval items take indices
``[0, EVAL_SPAN)``, train items ``EVAL_SPAN`` and up, so the two never share a generator seed.
Train prompt ``i`` picks its dataset by weight from ``(run seed, i)``; a train item whose
question is also an eval question is replaced (same dataset, a seeded index far above), so eval
is held out by content as well.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
import threading
from collections import OrderedDict
from typing import Any, Literal

from pydantic import Field, field_validator

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.reasoning_gym import make_reward
from rollwise.tasks.base import Task
from rollwise.tasks.labels import LabelsMode, labels_field
from rollwise.tasks.selection import SelectConfig, select
from rollwise.tasks.tool_demos import Conversation, calculator_episode, expression_of
from rollwise.types import Prompt

CHUNK = 500  # items per generator instance (reasoning-gym's default size and ReseedingDataset chunk)
EVAL_SPAN = 2**24  # indices below this are the eval split's
RETRY_BASE = 2**30  # replacement train indices lie in [EVAL_SPAN + RETRY_BASE, EVAL_SPAN + 2 * RETRY_BASE)
MAX_TRIES = 100  # candidates per train prompt before giving up
CACHED_CHUNKS = 4  # generator instances kept per dataset

INSTRUCTIONS = {
    "answer_tag": "Give your final answer between <answer> and </answer> tags.",
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
    "lenient": "Put the final answer in \\boxed{}.",
}


def _default_system_prompt(answer_format: str) -> str | None:
    """reasoning-gym's ``default`` system prompt for answer tags; none for ``\\boxed{}``."""
    if answer_format != "answer_tag":
        return None
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS["default"]


class DatasetSpec(StrictModel):
    """One reasoning-gym dataset in the mix."""

    name: str = Field(description="a reasoning-gym dataset, e.g. chain_sum, gsm_symbolic, leg_counting")
    weight: float = Field(1.0, gt=0, description="relative share of train prompts (and eval prompts)")
    config: dict[str, Any] = Field(default_factory=dict, description="the generator's own options (difficulty ranges...)")


class ReasoningGymConfig(StrictModel):
    """reasoning-gym's procedural generators (chain_sum, gsm_symbolic, ...), weighted; scored by their own score_answer."""

    name: Literal["reasoning_gym"] = "reasoning_gym"
    datasets: list[DatasetSpec] = Field(
        default_factory=lambda: [DatasetSpec(name="chain_sum")],
        description="datasets to mix: [{name, weight (default 1), config (the generator's options)}]",
    )
    eval_size: int = Field(200, ge=0, le=100_000, description="held-out prompts, never drawn for training")
    labels: LabelsMode = labels_field()
    answer_format: Literal["answer_tag", "boxed", "lenient"] = Field(
        "answer_tag", description="answer_tag: <answer>...</answer> (reasoning-gym's convention); boxed: \\boxed{...}; "
        "lenient: asks for \\boxed{} but reads the answer as math_answer does (the last \\boxed{}, else the text "
        "after 'answer is' or '####', else the last number) — for chat models that answer in prose")
    system_prompt: str | None = Field(
        None, description="null: the format's default (reasoning-gym's for answer_tag, none for boxed); '' for none")
    tool_demos: bool = Field(
        False, description="SFT demonstrations are calculator episodes: calculate(the item's expression), the result "
        "(not trained), the answer in answer_format — for rollout.environment=calculator on datasets whose items "
        "carry an expression (basic_arithmetic, chain_sum, products)")
    data_seed: int | None = Field(
        None, description="seed of the prompts (train stream and eval split); null = the run's seed. Fix it to train "
        "several seeds on one set of prompts (a ledger's paired arms) or to use a calibration (task.select)")
    select: SelectConfig | None = Field(
        None, description="train only on prompts chosen by the starting model's pass@k (`rollwise calibrate` writes "
        "the file): {path, never, mixed, always} shares, a third each by default (docs/tasks.md)")

    @field_validator("datasets")
    @classmethod
    def _some_unique(cls, value: list[DatasetSpec]) -> list[DatasetSpec]:
        if not value:
            raise ValueError("no datasets; list at least one, e.g. [{name: chain_sum}]")
        names = [d.name for d in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is listed twice; give each dataset one entry (one config)")
        return value

    def build(self, seed: int, sandbox=None) -> Task:  # no code runs: the sandbox is not used
        return build(self, seed)

    def data_seed_for(self, run_seed: int) -> int:
        return run_seed if self.data_seed is None else self.data_seed


def _import_factory():
    try:
        from reasoning_gym import factory
    except ImportError:
        raise ConfigError(
            "task.name 'reasoning_gym' needs the reasoning-gym package: pip install 'rollwise[reasoning]'"
        ) from None
    return factory


class Generator:
    """One reasoning-gym dataset addressed by an unbounded index (see the module docstring).

    Thread-safe: the async producer draws train prompts while evaluation and scoring run
    elsewhere, and some generators keep state on the instance (``knights_knaves``' ``self.rng``).
    """

    def __init__(self, factory, name: str, config: dict, base: int):
        self.factory, self.name, self.config, self.base = factory, name, dict(config), base
        self._chunks: OrderedDict[int, Any] = OrderedDict()
        self._scorer = None  # chunk 0's instance, kept for score_answer whatever the cache holds
        self._lock = threading.Lock()

    def _chunk(self, chunk: int):
        if chunk not in self._chunks:
            self._chunks[chunk] = self.factory.create_dataset(
                self.name, **self.config, seed=self.base + chunk * CHUNK, size=CHUNK)
            if len(self._chunks) > CACHED_CHUNKS:
                self._chunks.popitem(last=False)
        self._chunks.move_to_end(chunk)
        return self._chunks[chunk]

    def item(self, index: int) -> dict:
        chunk, offset = divmod(index, CHUNK)
        with self._lock:
            return self._chunk(chunk)[offset]

    def score_answer(self, answer: str | None, entry: dict) -> float:
        if self._scorer is None:
            with self._lock:
                self._scorer = self._chunk(0)
        return self._scorer.score_answer(answer, entry)  # every chunk shares the config


def _check_spec(factory, i: int, spec: DatasetSpec) -> None:
    """ConfigError for an unknown dataset or config key, naming ``task.datasets[i]`` and the closest names."""
    known = sorted(n for n in factory.DATASETS if n != "composite")  # rollwise does the mixing itself
    if spec.name not in known:
        close = difflib.get_close_matches(spec.name, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"{len(known)} datasets: reasoning_gym.factory.DATASETS"
        raise ConfigError(f"task.datasets[{i}].name {spec.name!r} is not a reasoning-gym dataset; {hint}")
    fields = [f.name for f in dataclasses.fields(factory.DATASETS[spec.name][1]) if f.name not in ("seed", "size")]
    for key in spec.config:
        if key in ("seed", "size"):
            raise ConfigError(f"task.datasets[{i}].config.{key}: rollwise sets it (from the top-level seed); remove it")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"task.datasets[{i}].config: {key!r} is not a {spec.name} option; {hint}"
                              f"options: {', '.join(fields) or 'none'}")


def generators(cfg: ReasoningGymConfig, seed: int) -> list[Generator]:
    """One ``Generator`` per configured dataset, each checked by generating an item."""
    factory = _import_factory()
    out = []
    for i, spec in enumerate(cfg.datasets):
        _check_spec(factory, i, spec)
        base = random.Random(f"reasoning_gym:{seed}:{i}:{spec.name}").randrange(2**30)
        gen = Generator(factory, spec.name, spec.config, base)
        try:
            gen.item(EVAL_SPAN)  # builds and validates the config, generates train item 0
        except Exception as err:  # the generator's own AssertionError, ValueError, TypeError...
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(f"task.datasets[{i}].config: {spec.name} rejects {spec.config} ({why})") from None
        out.append(gen)
    return out


def make_prompt(pid: str, dataset: str, entry: dict, answer_format: str, system_prompt: str | None) -> Prompt:
    question = str(entry["question"])
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": f"{question}\n\n{INSTRUCTIONS[answer_format]}"})
    answer = entry.get("answer")
    columns = {"dataset": dataset, "question": question, "answer": answer, "metadata": entry.get("metadata", {})}
    return Prompt(id=pid, text=question, answer=None if answer is None else str(answer), columns=columns,
                  messages=messages)


class ReasoningGymSource:
    """Train prompts: prompt ``i`` is a function of ``(seed, i)``; eval questions are never drawn."""

    def __init__(self, gens: list[Generator], weights: list[float], seed: int, answer_format: str,
                 system_prompt: str | None, exclude: set[str]):
        self.gens, self.weights, self.seed = gens, weights, seed
        self.answer_format, self.system_prompt, self.exclude = answer_format, system_prompt, exclude

    def dataset_of(self, index: int, split: str = "train") -> int:
        """Which dataset prompt ``index`` of ``split`` comes from (weighted, seeded per index)."""
        rng = random.Random(f"reasoning_gym-{split}:{self.seed}:{index}")
        return rng.choices(range(len(self.gens)), weights=self.weights)[0]

    def get(self, index: int) -> Prompt:
        gen = self.gens[self.dataset_of(index)]
        retry = random.Random(f"reasoning_gym-retry:{self.seed}:{index}")
        last_error = None
        for attempt in range(MAX_TRIES):
            at = index if attempt == 0 else RETRY_BASE + retry.randrange(RETRY_BASE)
            try:
                entry = gen.item(EVAL_SPAN + at)
            except Exception as err:  # a generator may fail on a rare seed: take another item
                last_error = err
                continue
            if str(entry["question"]) not in self.exclude:
                return make_prompt(f"train-{index}", gen.name, entry, self.answer_format, self.system_prompt)
        raise RuntimeError(f"reasoning_gym: no train item for prompt {index} of {gen.name} in {MAX_TRIES} tries "
                           f"(eval holds its every question, or the generator fails: {last_error!r}); "
                           "lower task.eval_size or widen the dataset's config")


def eval_prompts(source: ReasoningGymSource, size: int) -> list[Prompt]:
    """``size`` distinct eval prompts from indices below ``EVAL_SPAN`` (bounded search)."""
    evals: list[Prompt] = []
    seen: set[str] = set()
    for j in range(50 * size):
        if len(evals) == size:
            break
        gen = source.gens[source.dataset_of(j, "eval")]
        try:
            entry = gen.item(j)
        except Exception:  # a rare seed the generator cannot serve
            continue
        if str(entry["question"]) not in seen:
            seen.add(str(entry["question"]))
            evals.append(make_prompt(f"eval-{len(evals)}", gen.name, entry, source.answer_format, source.system_prompt))
    if len(evals) < size:
        raise ConfigError(f"task.eval_size: only {len(evals)} distinct reasoning-gym problems found for "
                          f"{size}; lower task.eval_size or widen the datasets' configs")
    return evals


def demonstrate(prompt: Prompt, answer_format: str = "answer_tag") -> str | None:
    """The reference answer in the answer format (datasets without a single answer have none)."""
    if prompt.answer is None:
        return None
    return f"\\boxed{{{prompt.answer}}}" if answer_format in ("boxed", "lenient") else f"<answer>{prompt.answer}</answer>"


def tool_demonstration(prompt: Prompt, answer_format: str = "answer_tag") -> Conversation | None:
    """A calculator episode for the prompt: ``calculate`` on its row's expression, the result, then the
    reference answer in the answer format (None when the item has no expression the calculator
    evaluates to its answer)."""
    expression, final = expression_of(prompt), demonstrate(prompt, answer_format)
    if expression is None or final is None:
        return None
    return calculator_episode(expression, prompt.answer, final)


def check_tool_demos(source: "ReasoningGymSource") -> None:
    """``task.tool_demos``: every dataset's first train item must have a calculator demonstration."""
    for i, gen in enumerate(source.gens):
        index = next(j for j in range(10_000) if source.dataset_of(j) == i)
        prompt = source.get(index)
        if tool_demonstration(prompt) is None:
            raise ConfigError(f"task.tool_demos: reasoning-gym {gen.name} item {prompt.text[:60]!r} has no arithmetic "
                              "expression the calculator evaluates to its answer (metadata.expression); tool "
                              "demonstrations are made for basic_arithmetic, chain_sum and products")


def build(cfg: ReasoningGymConfig, run_seed: int = 0) -> Task:
    """The task; its prompts come from ``cfg.data_seed`` (default ``run_seed``); ``task.select`` narrows the
    train stream to calibrated prompts, shuffled per epoch by ``run_seed``."""
    seed = cfg.data_seed_for(run_seed)
    gens = generators(cfg, seed)
    system = cfg.system_prompt if cfg.system_prompt is not None else _default_system_prompt(cfg.answer_format)
    source = ReasoningGymSource(gens, [d.weight for d in cfg.datasets], seed, cfg.answer_format, system, set())
    evals = eval_prompts(source, cfg.eval_size)
    source.exclude = {p.text for p in evals}
    names = ", ".join(f"{d.name} x{d.weight:g}" for d in cfg.datasets)
    if cfg.tool_demos:
        check_tool_demos(source)
    demo = tool_demonstration if cfg.tool_demos else demonstrate
    return Task(
        name="reasoning_gym",
        train=source if cfg.select is None else select(source, cfg, run_seed),
        eval=evals,
        rewards={"reasoning_gym": make_reward({g.name: g.score_answer for g in gens}, cfg.answer_format)},
        demonstrate=lambda prompt: demo(prompt, cfg.answer_format),
        description=f"reasoning-gym: {names}; answers in {cfg.answer_format}"
                    + (f"; train prompts selected by pass@k ({cfg.select.path})" if cfg.select else "")
                    + ("; demonstrations call the calculator" if cfg.tool_demos else ""),
    )
