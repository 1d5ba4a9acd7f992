"""``countdown``: reach a target from 3-4 given numbers with + - * / (TinyZero's RLVR toy task).

Prompt: the numbers, then the target, then a colon::

    nums 3 7 25 target 46:

Completion: a space, one arithmetic expression over some of the numbers (each used at most
as often as it is given, not necessarily all), ``=``, and the target::

     25+3*7=46

The reward evaluates the text before the first ``=`` exactly (``Fraction`` arithmetic, so
``7/2*2`` is 7) and accepts it when the value equals the target. The ``=<integer>`` suffix is
optional, but when present it must be the integer the expression evaluates to; nothing may
follow it. Model text is never ``eval``-ed: it is limited to digits, ``+-*/()`` and spaces,
parsed with :mod:`ast`, and walked node by node (at most ``MAX_NODES`` nodes).

Instances are always solvable: the target is the value of a random expression over a random
subset (two or more) of the numbers, built with exact division only and no negative
intermediate values; the target lies in ``1..max_target`` and is not itself a given number.
Given numbers may repeat.
"""

from __future__ import annotations

import operator
import random
from typing import Literal

from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.filter.countdown import MAX_CHARS, check, countdown_reward  # noqa: F401  (the task's verifier)
from rollwise.tasks.base import Task
from rollwise.types import Prompt

# -- instance generation -------------------------------------------------------------------

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}  # "/" only when exact


def _combine(rng: random.Random, a: tuple, b: tuple) -> tuple | None:
    """Join two (value, text, precedence) terms with a random op; None if the op is invalid."""
    op = rng.choice("+-*/")
    if op in "-/" and a[0] < b[0]:
        a, b = b, a
    if (op == "/" and (b[0] == 1 or a[0] % b[0])) or (op == "-" and a[0] == b[0]):
        return None  # keep every intermediate a positive integer, and skip "/1"
    value = _APPLY[op](a[0], b[0])
    left = a[1] if a[2] >= _PREC[op] else f"({a[1]})"
    # the right operand keeps parentheses unless the op is associative over it (+ over +-, * over */)
    right_needs = b[2] < _PREC[op] or (op in "-/" and b[2] == _PREC[op])
    right = f"({b[1]})" if right_needs else b[1]
    return value, f"{left}{op}{right}", _PREC[op]


def _random_solution(rng: random.Random, nums: list[int]) -> tuple[int, str] | None:
    """A random expression over a random subset (size >= 2) of ``nums`` and its value."""
    subset = rng.sample(nums, rng.randint(2, len(nums)))
    terms = [(n, str(n), 3) for n in subset]
    while len(terms) > 1:
        i, j = rng.sample(range(len(terms)), 2)
        joined = _combine(rng, terms[i], terms[j])
        if joined is None:
            return None
        terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [joined]
    return terms[0][0], terms[0][1]


class CountdownSampler:
    """Draws solvable instances; as a train source, prompt ``i`` is a function of ``(seed, i)``."""

    def __init__(self, seed: int, min_numbers: int, max_numbers: int, max_number: int, max_target: int):
        self.seed, self.min_numbers, self.max_numbers = seed, min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target
        self.exclude: set[str] = set()

    def sample(self, rng: random.Random, pid: str) -> Prompt:
        while True:
            nums = [rng.randint(1, self.max_number) for _ in range(rng.randint(self.min_numbers, self.max_numbers))]
            found = _random_solution(rng, nums)
            if found and 1 <= found[0] <= self.max_target and found[0] not in nums:
                return make_prompt(pid, nums, found[0], found[1])

    def get(self, index: int) -> Prompt:
        rng = random.Random(f"countdown:{self.seed}:{index}")
        while True:
            prompt = self.sample(rng, f"train-{index}")
            if prompt.text not in self.exclude:
                return prompt


def make_prompt(pid: str, nums: list[int], target: int, solution: str) -> Prompt:
    text = f"nums {' '.join(map(str, nums))} target {target}:"
    return Prompt(id=pid, text=text, columns={"nums": list(nums), "target": target, "solution": solution})


def demonstrate(prompt: Prompt) -> str:
    """The generating expression as a completion, e.g. ``" 25+3*7=46"``."""
    return f" {prompt.columns['solution']}={prompt.columns['target']}"


def build(
    seed: int = 0,
    eval_size: int = 200,
    min_numbers: int = 3,
    max_numbers: int = 4,
    max_number: int = 25,
    max_target: int = 999,
) -> Task:
    if not 2 <= min_numbers <= max_numbers <= 6:
        raise ValueError(f"countdown needs 2 <= min_numbers <= max_numbers <= 6, got {min_numbers}..{max_numbers}")
    if max_number < 2 or max_target < 1:
        raise ValueError(f"countdown needs max_number >= 2 and max_target >= 1, got {max_number}, {max_target}")
    sampler = CountdownSampler(seed, min_numbers, max_numbers, max_number, max_target)
    eval_rng = random.Random(f"countdown-eval:{seed}")
    evals: list[Prompt] = []
    for _ in range(50 * eval_size):  # bounded: tiny ranges may have fewer distinct instances
        if len(evals) == eval_size:
            break
        prompt = sampler.sample(eval_rng, f"eval-{len(evals)}")
        if prompt.text not in sampler.exclude:
            sampler.exclude.add(prompt.text)
            evals.append(prompt)
    return Task(
        name="countdown",
        train=sampler,
        eval=evals,
        rewards={"countdown": countdown_reward},
        demonstrate=demonstrate,
        description=f"reach a target from {min_numbers}-{max_numbers} numbers in 1..{max_number} with + - * /",
    )


class CountdownConfig(StrictModel):
    """Reach a target from 3-4 numbers with + - * / (each used at most once); checked with ast, never eval."""

    name: Literal["countdown"] = "countdown"
    min_numbers: int = Field(3, ge=2, le=6, description="fewest numbers given per prompt")
    max_numbers: int = Field(4, ge=2, le=6, description="most numbers given per prompt")
    max_number: int = Field(25, ge=2, le=10_000, description="given numbers are drawn from 1..max_number")
    max_target: int = Field(999, ge=1, description="targets lie in 1..max_target")
    eval_size: int = Field(200, ge=0, description="held-out prompts, never drawn for training")

    @model_validator(mode="after")
    def _ordered(self) -> "CountdownConfig":
        if self.min_numbers > self.max_numbers:
            raise ValueError(f"min_numbers ({self.min_numbers}) must be <= max_numbers ({self.max_numbers})")
        return self

    def build(self, seed: int, sandbox=None) -> Task:  # no code runs: the sandbox is not used
        return build(seed, self.eval_size, self.min_numbers, self.max_numbers, self.max_number, self.max_target)
