"""``code``: write a Python expression that maps the shown inputs to the shown outputs.

Prompt: the values of a small integer function at ``x = 0``, ``1`` and ``shown - 2`` other
points of ``2..9``, then ``f(x)=``::

    f(0)=1 f(1)=4 f(3)=10 f(6)=19 f(8)=25 f(x)=

Completion: a space and one Python expression in ``x``::

     x*3+1

The reward runs ``f = lambda x: (<expression>)`` in the sandbox (``rollwise.filter.sandbox``)
on ``hidden`` held-back inputs ``x >= 10`` (never shown in the prompt, and their expected values never
enter the sandbox) and scores it with ``test_threshold``: 1 when every hidden case matches
(``threshold`` 1.0), or the fraction passed with ``partial``. Any expression that computes
the function passes (``3*x+1`` as well as ``x*3+1``): the grade is what the code does.

Functions come from a few families whose parameters can be read off the examples, so a tiny
character-level model can learn the task after a short SFT warm start: ``add`` (``x+b``),
``sub`` (``x-b``), ``mul`` (``x*a``), ``affine`` (``x*a+b``), ``square`` (``x*x+b``) and
``mod`` (``x%m``).
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.code import call_cases, run_cases
from rollwise.filter.rewards import as_text
from rollwise.filter.sandbox import Sandbox
from rollwise.tasks.base import Task
from rollwise.types import Prompt, Score

FAMILIES = ("add", "sub", "mul", "affine", "square", "mod")
MAX_EXPRESSION_CHARS = 200
CASE_TIMEOUT_S = 1.0
SHOWN_RANGE = 10  # shown inputs are 0, 1 and a sample of 2..9; hidden ones are >= 10


def _draw(rng: random.Random, family: str, max_const: int, shown: int) -> str:
    c = lambda lo: rng.randint(lo, max(lo, max_const))
    return {
        "add": lambda: f"x+{c(1)}",
        "sub": lambda: f"x-{c(1)}",
        "mul": lambda: f"x*{c(2)}",
        "affine": lambda: f"x*{c(2)}+{c(1)}",
        "square": lambda: f"x*x+{c(1)}",
        "mod": lambda: f"x%{rng.randint(2, max(2, min(max_const, shown - 1)))}",
    }[family]()


def make_prompt(pid: str, expr: str, shown_x: list[int], hidden_x: list[int]) -> Prompt:
    fn = eval(f"lambda x: {expr}")  # our own generated expression, never model text
    text = " ".join(f"f({x})={fn(x)}" for x in shown_x) + " f(x)="
    return Prompt(id=pid, text=text, columns={"solution": expr, "hidden_x": hidden_x,
                                              "hidden_y": [fn(x) for x in hidden_x]})


class CodeSource:
    """Procedural prompts: prompt ``i`` is a function of ``(seed, i)``, skipping eval prompts."""

    def __init__(self, seed: int, families: list[str], max_const: int, shown: int, hidden: int):
        self.seed, self.families, self.max_const, self.shown, self.hidden = seed, families, max_const, shown, hidden
        self.exclude: set[str] = set()

    def sample(self, rng: random.Random, pid: str) -> Prompt:
        expr = _draw(rng, rng.choice(self.families), self.max_const, self.shown)
        # x = 0 and 1 always (constants can be read off them), the rest drawn from 2..9, so one
        # function appears in many distinct prompts and the eval split holds out instances
        shown_x = [0, 1] + sorted(rng.sample(range(2, SHOWN_RANGE), self.shown - 2))
        hidden_x = rng.sample(range(SHOWN_RANGE, SHOWN_RANGE + 4 * self.hidden), self.hidden)
        return make_prompt(pid, expr, shown_x, hidden_x)

    def get(self, index: int) -> Prompt:
        rng = random.Random(f"code:{self.seed}:{index}")
        for _ in range(10_000):
            prompt = self.sample(rng, f"train-{index}")
            if prompt.text not in self.exclude:
                return prompt
        raise ValueError("code: the eval split holds (nearly) every problem; lower task.eval_size or task.max_const")


def _start(sandbox: Sandbox | None) -> None:
    """Start the run's sandbox workers now: a missing sandbox is an error before training, not 0 rewards."""
    if sandbox is None:
        raise ConfigError("code tasks run programs in the run's sandbox: build the task with "
                          "task.build(seed, sandbox) (the trainer passes its own)")
    sandbox.pool  # noqa: B018  (starting the pool is the point)


def demonstrate(prompt: Prompt) -> str:
    return " " + prompt.columns["solution"]


def code_fn_reward(threshold: float = 1.0, partial: bool = False, sandbox: Sandbox | None = None):
    """The task's reward: hidden ``f(x)`` cases of the completion's expression, run in the sandbox."""

    def code_fn(prompts, completions, hidden_x, hidden_y, **_) -> list[float]:
        cases, early = [], {}
        for k, completion in enumerate(completions):
            expr = as_text(completion).strip()
            if not expr:
                early[k] = Score(0.0, "empty expression")
            elif "\n" in expr or len(expr) > MAX_EXPRESSION_CHARS:
                early[k] = Score(0.0, f"not a single expression of at most {MAX_EXPRESSION_CHARS} characters")
            program = f"f = lambda x: ({expr})"
            cases.append([] if k in early else
                         call_cases(program, [f"f({x})" for x in hidden_x[k]], list(hidden_y[k]), CASE_TIMEOUT_S))
        scores = run_cases(cases, threshold, partial, sandbox)
        return [early.get(k, s) for k, s in enumerate(scores)]

    code_fn.__doc__ = "hidden f(x) cases of a Python expression, run in the sandbox (code task)"
    return code_fn


class CodeConfig(StrictModel):
    """Write a Python expression in x matching shown input/output pairs; graded on hidden cases in the sandbox."""

    name: Literal["code"] = "code"
    families: list[Literal[FAMILIES]] = Field(list(FAMILIES), min_length=1,
                                              description="function families to draw from")
    max_const: int = Field(9, ge=2, le=99, description="constants are drawn from 1..max_const (2.. for * and %)")
    shown: int = Field(5, ge=2, le=10, description="examples in the prompt: x = 0, 1 and shown-2 others from 2..9")
    hidden: int = Field(6, ge=1, le=20, description="hidden cases graded in the sandbox, at x >= 10")
    threshold: float = Field(1.0, gt=0, le=1, description="test_threshold τ: reward 1 when pass fraction >= τ")
    partial: bool = Field(False, description="reward the fraction of hidden cases passed instead")
    eval_size: int = Field(200, ge=0, description="held-out prompts, never drawn for training")
    def build(self, seed: int, sandbox: Sandbox | None = None) -> Task:
        _start(sandbox)
        source = CodeSource(seed, list(self.families), self.max_const, self.shown, self.hidden)
        eval_rng = random.Random(f"code-eval:{seed}")
        evals: list[Prompt] = []
        for _ in range(100 * max(self.eval_size, 1)):
            if len(evals) == self.eval_size:
                break
            prompt = source.sample(eval_rng, f"eval-{len(evals)}")
            if prompt.text not in source.exclude:
                source.exclude.add(prompt.text)
                evals.append(prompt)
        if len(evals) < self.eval_size:
            raise ValueError(f"code: only {len(evals)} distinct problems for task.eval_size={self.eval_size}; "
                             "lower task.eval_size or raise task.max_const")
        return Task(
            name="code",
            train=source,
            eval=evals,
            rewards={"code_fn": code_fn_reward(self.threshold, self.partial, sandbox)},
            demonstrate=demonstrate,
            description=f"Python expressions for {', '.join(self.families)} functions, {self.hidden} hidden cases",
        )
