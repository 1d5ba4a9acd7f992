"""Built-in environments (``rollout.environment: <name>``), no network needed.

- ``calculator``: one tool, ``calculate(expression)``, exact arithmetic on integers and
  decimals (+, -, *, /, //, %, **, parentheses) read with ``ast`` — never ``eval``.
- ``python_tool``: one tool, ``run_python(code)``, executed in rollwise's sandbox (a
  separate unprivileged process; ``filter/sandbox``): its stdout (and the last stderr line on an
  error), time-limited. One sandbox pool per process, started on the first call.
- ``guess_number``: a multi-turn task with feedback. ``reset`` draws a secret from the row's
  ``secret`` column (else from the row's ``seed``/prompt id); ``guess(n)`` answers "higher",
  "lower" or "correct"; ``get_reward()`` is 1 when the last guess was right; the anchor state
  is the feedback seen so far (``observation_key``), so GiGPO groups equal histories.
"""

from __future__ import annotations

import ast
import atexit
import math
import operator
import threading

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# The largest integer a calculation may make, in bits (~4,200 digits: 10 ** 1000 is fine, and its
# decimal text stays under Python's int_max_str_digits). Bounded *before* computing: a big-int power or
# product holds the GIL for as long as it runs, so it must never start (the tool timeout is the backstop).
MAX_BITS = 14_000


def _result_bits(op: ast.operator, left, right) -> float:
    """An upper bound on the bits of ``left op right`` for integers (0 where the result cannot grow
    past its operands by more than a bit: + - // % and anything with a float, which overflows fast)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return 0.0
    if isinstance(op, ast.Mult):
        return float(left.bit_length() + right.bit_length())
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        return right * math.log2(abs(left))
    return 0.0


def arithmetic(expression: str):
    """The value of an arithmetic expression of number literals (raises ValueError otherwise, and
    for a result past ``MAX_BITS`` bits: ``((10 ** 1000) ** 1000) ** 1000`` is refused, not computed)."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if _result_bits(node.op, left, right) > MAX_BITS:
                raise ValueError(f"the result would be too large (over {MAX_BITS} bits)")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot parse {expression[:60]!r}") from None
    return value(tree.body)


class Calculator:
    """Exact arithmetic as a tool."""

    def reset(self, **row) -> None:
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: numbers with + - * / // % ** and parentheses, e.g. "(12 + 7) * 3"
        """
        result = arithmetic(expression)
        return str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)


_SANDBOX = None
_SANDBOX_LOCK = threading.Lock()


def _sandbox():
    global _SANDBOX
    with _SANDBOX_LOCK:
        if _SANDBOX is None:
            from rollwise.filter.sandbox import Sandbox, SandboxConfig

            _SANDBOX = Sandbox(SandboxConfig(workers=1))
            atexit.register(_SANDBOX.close)
        return _SANDBOX


class PythonTool:
    """Python, run in the sandbox, as a tool. In a run, the run's sandbox (``sandbox.*`` settings),
    started when the environment loads: a sandbox that cannot start is a ConfigError then, not an
    error message on every call."""

    in_process = True  # its code runs in the sandbox, which kills it at timeout_s: no worker process needed
    uses_sandbox = True  # rollwise passes the run's Sandbox to the constructor (tasks/environment.py)
    timeout_s = 5.0

    def __init__(self, sandbox=None):
        self.sandbox = sandbox  # None: a process-wide one, started on the first call (built outside a run)

    def reset(self, **row) -> None:
        return None

    def run_python(self, code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: a complete Python program; print the values you need
        """
        result = (self.sandbox or _sandbox()).pool.run(code, timeout_s=self.timeout_s)
        if result.timed_out:
            return f"timed out after {self.timeout_s:g} s"
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
            return (result.stdout + last).strip()
        return result.stdout.strip()


class GuessNumber:
    """Find a secret integer in [low, high] by guessing; each guess is answered higher/lower/correct."""

    low, high = 1, 100

    def reset(self, **row) -> str | None:
        import random

        secret = row.get("secret")
        self.secret = int(secret) if secret is not None else random.Random(str(row.get("seed", row))).randint(
            self.low, self.high)
        self.history: list[str] = []
        self.solved = False
        return None

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: your guess
        """
        number = int(number)
        answer = "correct" if number == self.secret else ("higher" if number < self.secret else "lower")
        self.history.append(f"{number}:{answer}")
        self.solved = answer == "correct"
        return answer

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0

    def observation_key(self) -> str:
        return "|".join(self.history)
