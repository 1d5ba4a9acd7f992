"""The ``arith`` verifier: the integer after the completion's last ``#`` against the answer.

The task (``rollwise.tasks.arith``) writes its working column by column and ends with
``#<answer>``; only that final number is judged.
"""

from __future__ import annotations

import re

from rollwise.filter.rewards import as_text
from rollwise.types import Score

_ANSWER = re.compile(r"#\s*(-?\d+)\s*$")


def parse_answer(completion: str) -> int | None:
    """The integer after the last ``#`` (the whole completion must end there), else None."""
    m = _ANSWER.search(completion.strip())
    return int(m.group(1)) if m else None


def arith_reward(prompts, completions, answer, **_) -> list[float]:
    """1.0 when the number after the final ``#`` equals ``answer``, else 0.0 with a reason; the
    number read (``Score.answer``, e.g. ``"4"``) is what maj@k votes with.

    >>> arith_reward(["2+2="], [" 2+2+0=04 #4"], answer=["4"])
    [1.0]
    """
    out = []
    for completion, expected in zip(completions, answer):
        got = parse_answer(as_text(completion))
        if got is None:
            out.append(Score(0.0, "no final '#<integer>' answer"))
        elif expected is None:  # no label (task.labels: none): the answer read is still reported (majority_vote)
            out.append(Score(0.0, "no reference answer", answer=str(got)))
        elif got != int(expected):
            out.append(Score(0.0, f"wrong answer {got} (expected {expected})", answer=str(got)))
        else:
            out.append(Score(1.0, answer=str(got)))
    return out


def _columns(a: int, b: int, op: str) -> list[str]:
    da, db = str(a)[::-1], str(b)[::-1]
    width = max(len(da), len(db))
    cols, carry = [], 0
    for i in range(width):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        if op == "+":
            s = x + y + carry
            carry_out, digit = divmod(s, 10)
        else:
            s = x - y - carry
            carry_out, digit = (1, s + 10) if s < 0 else (0, s)
        cols.append(f"{x}{op}{y}{op}{carry}={carry_out}{digit}")
        carry = carry_out
    return cols


def solve(a: int, op: str, b: int) -> str:
    """The task's working and answer for ``a op b`` (the demonstration completion; what ``fapo``
    checks a correct answer's working against)."""
    if op == "*":  # no working: the answer alone
        return f" #{a * b}"
    if op == "+":
        return " " + " ".join(_columns(a, b, "+")) + f" #{a + b}"
    if a >= b:
        return " " + " ".join(_columns(a, b, "-")) + f" #{a - b}"
    return " neg " + " ".join(_columns(b, a, "-")) + f" #{a - b}"
