"""The ``countdown`` verifier: an arithmetic expression over the given numbers that reaches the target.

The reward evaluates the text before the first ``=`` exactly (``Fraction`` arithmetic, so
``7/2*2`` is 7) and accepts it when the value equals the target. The ``=<integer>`` suffix is
optional, but when present it must be the integer the expression evaluates to; nothing may
follow it. Model text is never ``eval``-ed: it is limited to digits, ``+-*/()`` and spaces,
parsed with :mod:`ast`, and walked node by node (at most ``MAX_NODES`` nodes). The task that
generates instances is ``rollwise.tasks.countdown`` (TinyZero's RLVR toy task).
"""

from __future__ import annotations

import ast
from collections import Counter
from fractions import Fraction

from rollwise.filter.rewards import as_text
from rollwise.types import Score

MAX_CHARS = 200  # longer expressions score 0 without being parsed
MAX_NODES = 64  # ast nodes; 4 numbers and 3 operators need 15
_ALLOWED_CHARS = set("0123456789+-*/() ")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_BAD_OPS = {ast.Pow: "**", ast.FloorDiv: "//"}  # the only other binary ops the allowed characters can spell


class _Reject(Exception):
    """Why an expression scores 0; the message is the recorded reason."""


def _parse(expr: str) -> ast.expr:
    """The expression's syntax tree, after checking its characters, length and size."""
    if not expr:
        raise _Reject("empty expression")
    if len(expr) > MAX_CHARS:
        raise _Reject(f"expression longer than {MAX_CHARS} characters")
    bad = sorted(set(expr) - _ALLOWED_CHARS)
    if bad:
        raise _Reject(f"unparseable expression: character {bad[0]!r} not allowed")
    try:
        tree = ast.parse(expr, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _Reject("unparseable expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise _Reject(f"expression has more than {MAX_NODES} syntax nodes")
    return tree


def _literals(node: ast.expr) -> list[int]:
    """The integer literals of an allowed tree, left to right; rejects any other syntax."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            raise _Reject(f"unsupported operator {_BAD_OPS.get(type(node.op), '?')!r}")
        return _literals(node.left) + _literals(node.right)
    if isinstance(node, ast.UnaryOp):
        raise _Reject("unary minus or plus not allowed")
    raise _Reject("unparseable expression")


def _value(node: ast.expr) -> Fraction:
    """Exact value of a tree that passed ``_literals``; ZeroDivisionError on ``x/0``."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    left, right = _value(node.left), _value(node.right)
    op = type(node.op)
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    return left / right


def _check_numbers(used: list[int], given: list[int]) -> None:
    available = Counter(given)
    for n, count in Counter(used).items():
        if available[n] == 0:
            raise _Reject(f"uses {n} which is not given")
        if count > available[n]:
            raise _Reject(f"uses {n} {count} times but it is given {available[n]} time(s)")


def _split(completion: str) -> tuple[str, int | None]:
    """``" 25+3*7=46"`` → ``("25+3*7", 46)``; the stated result is optional."""
    expr, eq, stated = completion.strip().partition("=")
    if not eq:
        return expr.strip(), None
    stated = stated.strip()
    if not stated.lstrip("-").isdigit() or len(stated) > 12:
        raise _Reject(f"text after '=' is not an integer: {stated[:20]!r}")
    return expr.strip(), int(stated)


def check(completion: str, nums: list[int], target: int) -> Score:
    """Score one completion: 1.0 when its expression uses the given numbers and hits the target.

    ``Score.answer`` (what maj@k votes with) is the expression with its spaces removed, or None
    when there is none to read.

    >>> check(" 25+3*7=46", [3, 7, 25], 46), check(" 25+3*5", [3, 7, 25], 46).reason
    (1.0, 'uses 5 which is not given')
    """
    answer = None
    try:
        expr, stated = _split(completion)
        answer = "".join(expr.split())[:MAX_CHARS] or None
        tree = _parse(expr)
        _check_numbers(_literals(tree), list(nums))
        try:
            value = _value(tree)
        except ZeroDivisionError:
            raise _Reject("division by zero") from None
        if stated is not None and stated != value:
            raise _Reject(f"states {stated} but the expression is {value}")
        if value != int(target):
            raise _Reject(f"value {value} != target {target}")
        return Score(1.0, answer=answer)
    except _Reject as why:
        return Score(0.0, str(why), answer=answer)
    except Exception as err:  # never raise on model output
        return Score(0.0, f"unparseable expression ({type(err).__name__})", answer=answer)


def countdown_reward(prompts, completions, nums, target, **_) -> list[float]:
    """TRL-style reward: ``check`` each completion against its prompt's ``nums`` and ``target``.

    >>> countdown_reward(["nums 3 7 25 target 46:"] * 2, [" 25+3*7=46", " 25+7=32"], [[3, 7, 25]] * 2, [46] * 2)
    [1.0, 0.0]
    """
    return [check(as_text(c), n, t) for c, n, t in zip(completions, nums, target)]
