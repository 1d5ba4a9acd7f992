"""``arith``: multi-digit addition, subtraction and multiplication.

Prompt ``347+58=``; the completion works column by column from the least significant
digit, each column written ``x+y+c=CD`` (C the carry out, D the digit), then the answer
after ``#``::

    347+58= 7+8+0=15 4+5+1=10 3+0+1=04 #405

Subtraction writes ``x-y-b=BD`` (B the borrow out); when the result is negative the
completion starts with ``neg`` and works ``b-a`` instead::

    58-347= neg 7-8-0=19 4-5-1=18 3-0-1=02 #-289

Operands have ``min_digits``..``max_digits`` digits, so completions run from about 12
tokens (one column) to about 70 (six columns): the length variance later rollout
strategies exploit. The reward checks only the number after the last ``#``.

Multiplication (``ops`` with ``*``) has no working: the demonstration is the answer alone,
``347*58= #20126`` — exact arithmetic a tiny model cannot do in its head. With
``tool_demos`` every demonstration is instead a two-turn calculator episode
(``rollout.environment: calculator``; ``tasks/tool_demos.py``): the model turn calls
``calculate("347*58")`` and ends at EOS, the environment inserts the result ``20126``, the model
turn `` #20126`` answers. The SFT warm start renders it in the run's tool format (``plain``:
``<call>calculate("347*58")</call>`` then ``<result>20126</result>``; ``hermes``: through the
chat template) and trains the model turns only.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, model_validator

from rollwise.config import StrictModel
from rollwise.filter.arith import arith_reward, parse_answer, solve  # noqa: F401  (the task's verifier and working)
from rollwise.tasks.base import Task
from rollwise.tasks.labels import LabelsMode, labels_field
from rollwise.tasks.tool_demos import Conversation, calculator_episode
from rollwise.types import Prompt

OPS = "+-*"


class ArithSource:
    """Procedural train prompts: prompt ``i`` is a function of ``(seed, i)``, skipping eval items."""

    def __init__(self, seed: int, min_digits: int, max_digits: int, ops: str, exclude: set[str]):
        self.seed, self.min_digits, self.max_digits, self.ops = seed, min_digits, max_digits, ops
        self.exclude = exclude

    def sample(self, rng: random.Random) -> tuple[int, str, int]:
        def operand() -> int:
            digits = rng.randint(self.min_digits, self.max_digits)
            return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

        return operand(), rng.choice(self.ops), operand()

    def get(self, index: int) -> Prompt:
        rng = random.Random(f"arith:{self.seed}:{index}")
        for _ in range(10_000):
            a, op, b = self.sample(rng)
            if f"{a}{op}{b}=" not in self.exclude:
                return make_prompt(f"train-{index}", a, op, b)
        raise ValueError("arith: the eval split holds (nearly) every problem; lower task.eval_size or widen the digits")


def value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_prompt(pid: str, a: int, op: str, b: int) -> Prompt:
    answer = value(a, op, b)
    return Prompt(id=pid, text=f"{a}{op}{b}=", answer=str(answer), columns={"a": a, "op": op, "b": b})


def demonstrate(prompt: Prompt) -> str:
    c = prompt.columns
    return solve(c["a"], c["op"], c["b"])


def demonstrate_with_calculator(prompt: Prompt) -> Conversation:
    """A calculator episode: the call, the calculator's result (inserted, not trained), the answer.

    >>> from rollwise.tasks.tool_calls import FORMATS
    >>> [m["content"] for m in demonstrate_with_calculator(make_prompt("p", 347, "*", 58)).written(FORMATS["plain"])]
    ['<call>calculate("347*58")</call>', '20126', ' #20126']
    """
    c = prompt.columns
    result = str(value(c["a"], c["op"], c["b"]))
    return calculator_episode(f"{c['a']}{c['op']}{c['b']}", result, f" #{result}")


def build(seed: int = 0, eval_size: int = 200, min_digits: int = 1, max_digits: int = 5, ops: str = "+-",
          tool_demos: bool = False) -> Task:
    if not 1 <= min_digits <= max_digits <= 12:
        raise ValueError(f"arith needs 1 <= min_digits <= max_digits <= 12, got {min_digits}..{max_digits}")
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"arith ops must be made of '+', '-' and '*', got {ops!r}")
    eval_rng = random.Random(f"arith-eval:{seed}")
    sampler = ArithSource(seed, min_digits, max_digits, ops, exclude=set())
    evals, seen = [], set()
    for _ in range(100 * eval_size):
        if len(evals) == eval_size:
            break
        a, op, b = sampler.sample(eval_rng)
        if f"{a}{op}{b}=" not in seen:
            seen.add(f"{a}{op}{b}=")
            evals.append(make_prompt(f"eval-{len(evals)}", a, op, b))
    if len(evals) < eval_size:
        raise ValueError(
            f"arith: only {len(evals)} distinct problems found for task.eval_size={eval_size}; "
            "lower task.eval_size or widen the digit range"
        )
    sampler.exclude = seen
    return Task(
        name="arith",
        train=sampler,
        eval=evals,
        rewards={"arith": arith_reward},
        demonstrate=demonstrate_with_calculator if tool_demos else demonstrate,
        description=f"{min_digits}-{max_digits} digit {' and '.join(ops)}"
                    + (", demonstrations call the calculator" if tool_demos else ""),
    )


class ArithConfig(StrictModel):
    """Multi-digit addition/subtraction with column-by-column working (completions ~12-70 tokens), and
    multiplication answered directly or, with ``tool_demos``, through the calculator."""

    name: Literal["arith"] = "arith"
    min_digits: int = Field(1, ge=1, le=12, description="fewest digits per operand")
    max_digits: int = Field(5, ge=1, le=12, description="most digits per operand")
    ops: str = Field("+-", description="operators to draw from, any of '+', '-' (column-by-column working) and '*' "
                     "(the answer alone)")
    eval_size: int = Field(200, ge=0, description="held-out prompts, never drawn for training")
    labels: LabelsMode = labels_field()
    tool_demos: bool = Field(False, description="SFT demonstrations are calculator episodes (the call, the result "
                             "— not trained —, then `#answer`) in the run's tool format: for "
                             "rollout.environment=calculator")

    @model_validator(mode="after")
    def _valid(self) -> "ArithConfig":
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) must be <= max_digits ({self.max_digits})")
        if not self.ops or set(self.ops) - set(OPS):
            raise ValueError(f"ops must be made of '+', '-' and '*', got {self.ops!r}")
        return self

    def build(self, seed: int, sandbox=None) -> Task:  # no code runs: the sandbox is not used
        return build(seed, self.eval_size, self.min_digits, self.max_digits, self.ops, self.tool_demos)
