"""``math_answer``: is the completion's final answer mathematically equal to the reference?

The final answer is, in order of preference: the content of the last ``\\boxed{...}``; else
the rest of the line after the last ``####`` (GSM8K) or ``answer is``, whichever comes last;
else the last number in the text. It is compared with the reference by Hugging Face's
``math_verify`` (``parse`` then ``verify(gold, pred)``), so ``\\frac{1}{2}``, ``0.5`` and
``1/2`` agree, as do ``1,000`` and ``1000``.

Cost guards, because model text is adversarial in effect if not intent:

- extracted answers longer than ``MAX_ANSWER_CHARS`` score 0 unparsed;
- ``math_verify`` stops a slow ``parse``/``verify`` with ``signal.alarm``, which only works in
  the main thread (elsewhere ``signal.signal`` raises). In the main thread we pass
  ``PARSE_TIMEOUT_S``/``VERIFY_TIMEOUT_S`` (the alarm replaces any SIGALRM timer the caller
  set). In any other thread (a scorer running beside generation) ``math_answer`` sends the
  check to a helper process started with ``spawn`` — there it runs on the helper's main thread
  with the same alarms — and waits at most ``OFF_THREAD_TIMEOUT_S``; a helper that overruns
  (C code the alarm cannot interrupt) is killed and replaced, and the answer scores 0;
- before ``verify``, the parsed expression is rejected if it holds a power, factorial or
  binomial whose argument could be huge (``9^{9^{9^9}}`` would otherwise run until killed).
"""

from __future__ import annotations

import math
import multiprocessing
import re
import threading

import sympy
from math_verify import parse, verify
from math_verify.errors import TimeoutException

from rollwise.filter.rewards import as_text
from rollwise.types import Score

MAX_ANSWER_CHARS = 200
PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3
MAX_EXPONENT = 10_000  # largest power / factorial argument we let sympy evaluate
MAX_SYMPY_NODES = 500
OFF_THREAD_TIMEOUT_S = 2 * PARSE_TIMEOUT_S + VERIFY_TIMEOUT_S + 2  # parse gold and answer, verify, slack

_MARKER = re.compile(r"####|answer is", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), else None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin + 1 : i].strip()
    return None


def extract_answer(completion: str) -> str | None:
    """The completion's final answer text, or None when it has none.

    >>> extract_answer("so x = 3, and the answer is \\\\boxed{\\\\frac{1}{2}}."), extract_answer("2+2 #### 4")
    ('\\\\frac{1}{2}', '4')
    """
    boxed = last_boxed(completion)
    if boxed:
        return boxed
    markers = list(_MARKER.finditer(completion))
    if markers:
        after = completion[markers[-1].end() :].split("\n", 1)[0].strip().lstrip(":").strip().rstrip(".").strip()
        if after:
            return after
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _parse(text: str) -> list:
    """``math_verify.parse`` of ``text`` read as LaTeX math (``$...$``), then as plain text."""
    timeout = PARSE_TIMEOUT_S if _in_main_thread() else None
    candidates = [text] if "$" in text else [f"${text}$", text]
    for candidate in candidates:
        parsed = parse(candidate, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def _magnitude(expr) -> float:
    """A cheap upper bound on ``abs(expr)`` without evaluating it (symbols count as 1)."""
    if isinstance(expr, sympy.Number):
        try:
            return abs(float(expr))
        except (OverflowError, TypeError, ValueError):
            return math.inf
    args = [_magnitude(a) for a in getattr(expr, "args", ())]
    try:
        if isinstance(expr, sympy.Pow):
            return max(args[0], 2.0) ** args[1]
        if isinstance(expr, (sympy.factorial, sympy.gamma, sympy.binomial)):
            return max(args + [2.0]) ** max(args + [2.0])
        if isinstance(expr, sympy.Mul):
            return math.prod(max(a, 1.0) for a in args)
        return sum(args) if args else 1.0
    except OverflowError:
        return math.inf


def _too_costly(expr) -> bool:
    """True if evaluating ``expr`` could take sympy unbounded time (huge powers, factorials)."""
    if not isinstance(expr, sympy.Basic):
        return False
    for count, node in enumerate(sympy.preorder_traversal(expr)):
        if count > MAX_SYMPY_NODES:
            return True
        if isinstance(node, sympy.Pow) and _magnitude(node.exp) > MAX_EXPONENT:
            return True
        if isinstance(node, (sympy.factorial, sympy.gamma, sympy.binomial)):
            if any(_magnitude(a) > MAX_EXPONENT for a in node.args):
                return True
    return False


def normalise(answer: str) -> str:
    """An extracted answer as maj@k compares it: inner whitespace collapsed, ``$`` delimiters dropped.

    >>> normalise(" $x =  3$ ")
    'x = 3'
    """
    return " ".join(answer.split()).strip("$").strip()


def check(completion: str, gold: str) -> Score:
    """Score one completion against one reference answer; never raises. ``Score.answer`` is the
    extracted final answer (``normalise``-d), None when there is none or it is too long."""
    answer = extract_answer(completion)
    if answer is None:
        return Score(0.0, "no final answer found")
    if len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, f"final answer longer than {MAX_ANSWER_CHARS} characters")
    said = normalise(answer)
    gold_parsed, pred_parsed = _parse(gold), _parse(answer)
    if not gold_parsed:
        return Score(0.0, f"reference answer {gold[:40]!r} could not be parsed", answer=said)
    if not pred_parsed:
        return Score(0.0, f"final answer {answer[:40]!r} could not be parsed", answer=said)
    if any(_too_costly(e) for e in pred_parsed):
        return Score(0.0, f"final answer {answer[:40]!r} is too costly to evaluate", answer=said)
    timeout = VERIFY_TIMEOUT_S if _in_main_thread() else None
    if verify(gold_parsed, pred_parsed, timeout_seconds=timeout):
        return Score(1.0, answer=said)
    return Score(0.0, f"final answer {answer[:40]!r} is not equal to {gold[:40]!r}", answer=said)


def _serve(conn) -> None:
    """The helper process: ``check`` requests on its main thread (so math_verify's alarms work)."""
    conn.send("ready")
    while True:
        try:
            completion, gold = conn.recv()
        except EOFError:
            return
        try:
            score = check(completion, gold)
            conn.send((float(score), score.reason, score.answer))
        except BaseException as err:  # TimeoutException is a BaseException
            conn.send((0.0, f"could not check the answer ({type(err).__name__})", None))


class _OffThreadChecker:
    """``check`` in a helper process with a hard deadline; used from threads other than the main one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc = self._conn = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold torch's threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="math-answer-checker")
        self._proc.start()
        child.close()
        if not self._conn.poll(120) or self._conn.recv() != "ready":
            self._stop()
            raise RuntimeError("math_answer helper process did not start")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._conn.close()
        self._proc = self._conn = None

    def check(self, completion: str, gold: str, timeout: float) -> Score:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._stop()
                self._start()
            self._conn.send((completion, gold))
            if self._conn.poll(timeout):
                value, reason, answer = self._conn.recv()
                return Score(value, reason, answer)
            self._stop()  # still computing: kill it, the next call starts a fresh one
            return Score(0.0, f"checking the answer took longer than {timeout:g}s")


_off_thread = _OffThreadChecker()


def check_with_timeout(completion: str, gold: str) -> Score:
    """``check`` with a time limit in any thread (see the module docstring)."""
    if _in_main_thread():
        return check(completion, gold)
    return _off_thread.check(completion, gold, OFF_THREAD_TIMEOUT_S)


def math_answer(prompts, completions, answer, **_) -> list[float]:
    """TRL-style reward: 1.0 when a completion's final answer equals ``answer``, else 0.0 and why.

    >>> math_answer(["q", "q"], ["It is \\\\boxed{\\\\frac{3}{4}}", "The answer is 0.7"], answer=["0.75", "0.75"])
    [1.0, 0.0]
    """
    scores = []
    for completion, gold in zip(completions, answer):
        try:
            if gold is None:  # no label (task.labels: none): the answer read is still reported (majority_vote)
                said = extract_answer(as_text(completion))
                ok = said is not None and len(said) <= MAX_ANSWER_CHARS
                scores.append(Score(0.0, "no reference answer", answer=normalise(said) if ok else None))
            else:
                scores.append(check_with_timeout(as_text(completion), str(gold)))
        except (Exception, TimeoutException) as err:  # TimeoutException is a BaseException
            scores.append(Score(0.0, f"could not check the answer ({type(err).__name__})"))
    return scores
