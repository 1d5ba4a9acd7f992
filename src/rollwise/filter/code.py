"""Code graders: run a completion's program in the sandbox against tests, score pass/fail.

Four ways to judge a program, each run through ``rollwise.filter.sandbox`` (never in-process):

- **stdin/stdout cases** (``io_verifier``; Agnostics, "Learning to Code in Any Programming
  Language"): one run per case with the case's input on stdin; the case passes when stdout
  equals the expected output after stripping trailing whitespace on each line (and trailing
  blank lines). Expected outputs never enter the sandbox.
- **call cases**: expressions such as ``f(3)`` evaluated after the program in one run, each
  under its own timer; the printed ``repr`` is compared outside the sandbox with the expected
  value (``ast.literal_eval``), so expected values stay hidden from the program too.
- **assert tests** (MBPP style ``assert f(3) == 9``): an assert whose right side is a literal is
  split into a call case (hidden expected value); any other assert runs as its own program and
  passes when it exits 0 — that assert is then visible to the code under test.
- **exit code** (HumanEval style): program + test code; passes when it exits 0.

Scoring (``test_threshold``; "Verification Limits Code LLM Training"): with ``k`` of ``n`` tests
passed, ``r = 1[k/n >= τ]`` (τ = ``threshold``, 1.0 = all-or-nothing by default; the paper
suggests .8 for synthetic tests), or ``r = k/n`` with ``partial=True``. A ``pass_threshold``
dataset column sets τ per row. Reasons name the first failing test.

Departures: Python only here (Agnostics' per-language YAML ``file``/``compile``/``run`` is the
``io_verifier`` reward, ``rollwise.filter.io_lang``); the LLM soft verifier for problems with fewer than 3 tests is the ``test_threshold``
reward (``rollwise.filter.soft_verify``), which wraps these; the call and assert
split compares values with ``==`` after a ``repr``/``literal_eval`` round trip, so results that
are not literals (custom objects) fail a split assert.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from rollwise.config import ConfigError
from rollwise.filter.harness import harness_job, read_verdict
from rollwise.filter.rewards import as_text
from rollwise.filter.sandbox import Job, Sandbox
from rollwise.types import Score

PER_TEST_TIMEOUT_S = 2.0
MAX_CODE_CHARS = 20_000
SENTINEL = "\x00rollwise-case"
_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)

# evaluates each call under its own ITIMER_REAL, prints one sentinel line per call
_CALL_HARNESS = '''
import signal as _rw_signal
class _RwTimeout(BaseException):
    pass
def _rw_alarm(*_):
    raise _RwTimeout()
_rw_signal.signal(_rw_signal.SIGALRM, _rw_alarm)
for _rw_i, _rw_call in enumerate({calls!r}):
    _rw_signal.setitimer(_rw_signal.ITIMER_REAL, {timeout!r})
    try:
        _rw_out = "ok " + repr(eval(_rw_call))
    except _RwTimeout:
        _rw_out = "timeout"
    except BaseException as _rw_err:
        _rw_out = "error " + type(_rw_err).__name__
    finally:
        _rw_signal.setitimer(_rw_signal.ITIMER_REAL, 0)
    print({sentinel!r}, _rw_i, _rw_out, flush=True)
'''


def extract_code(completion) -> str:
    """The program in a completion: the last fenced code block if there is one, else the text."""
    text = as_text(completion)
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def normalize_output(text: str) -> str:
    """Trailing whitespace stripped per line, trailing blank lines dropped (io_verifier)."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def threshold_score(passed: int, total: int, threshold: float = 1.0, partial: bool = False,
                    first_failure: str = "") -> Score:
    """``1[passed/total >= threshold]`` (or the fraction with ``partial``), with a reason.

    >>> threshold_score(4, 5, 1.0), threshold_score(4, 5, 0.8), threshold_score(4, 5, partial=True)
    (0.0, 1.0, 0.8)
    """
    if total == 0:
        return Score(0.0, "no tests to run")
    fraction = passed / total
    value = fraction if partial else float(fraction >= threshold - 1e-12)
    reason = "" if passed == total else f"passed {passed}/{total} tests; first failure: {first_failure}"
    return Score(value, reason)


@dataclass
class _Case:
    """One test of one completion: a job to run, and how to judge its result."""

    job: Job | None
    judge: object  # callable(ExecResult) -> str ('' = passed, else why it failed)
    label: str


def _describe(res) -> str:
    if res.timed_out or res.reason:
        return res.reason or "timed out"
    tail = res.stderr.strip().splitlines()
    return f"exit status {res.returncode}" + (f" ({tail[-1][:120]})" if tail else "")


def _io_cases(code: str, cases: list[dict], timeout_s: float) -> list[_Case]:
    out = []
    for i, case in enumerate(cases):
        expected = normalize_output(str(case["output"]))

        def judge(res, expected=expected):
            if res.returncode != 0 or res.timed_out or res.reason:
                return _describe(res)
            got = normalize_output(res.stdout)
            return "" if got == expected else f"wrong output {got[:60]!r}"

        out.append(_Case(Job(code, str(case.get("input", "")), timeout_s), judge, f"case {i}"))
    return out


def call_cases(code: str, calls: list[str], expected: list, timeout_s: float) -> list[_Case]:
    """One run evaluating every call; one ``_Case`` per call sharing that run's result."""
    harness = _CALL_HARNESS.format(calls=list(calls), timeout=float(timeout_s), sentinel=SENTINEL)
    job = Job(code + "\n" + harness, "", timeout_s * len(calls) + 1.0)
    cases = []
    for i, (call, want) in enumerate(zip(calls, expected)):

        def judge(res, i=i, want=want):
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith(SENTINEL + f" {i} ")]
            if not lines:
                return _describe(res) if not res.ok else "produced no result"
            status = lines[-1][len(SENTINEL) + len(str(i)) + 2 :]
            if not status.startswith("ok "):
                return status
            try:
                got = ast.literal_eval(status[3:])
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return f"returned a non-literal {status[3:60]!r}"
            return "" if got == want else f"returned {status[3:60]}"

        cases.append(_Case(job if i == 0 else None, judge, call))
    return cases


def split_assert(test: str) -> tuple[str, object] | None:
    """``"assert f(3) == 9"`` → ``("f(3)", 9)`` when the right side is a literal, else None."""
    try:
        tree = ast.parse(test.strip())
    except (SyntaxError, ValueError, RecursionError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    cmp = tree.body[0].test
    if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq)):
        return None
    try:
        return ast.unparse(cmp.left), ast.literal_eval(cmp.comparators[0])
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return None


def harness_cases(candidate: str, tests: list[str], trusted: str, names: list[str] | None, timeout_s: float,
                  labels: list[str]) -> list[_Case]:
    """One sandbox run of ``rollwise.filter.harness``: ``tests`` run in a trusted process against
    proxies of the candidate's functions; one ``_Case`` per test, sharing that run's verdict."""
    program, stdin, tag = harness_job(candidate, tests, trusted, names, call_timeout=timeout_s)
    job = Job(program, stdin, timeout_s * (len(tests) + 2) + 2.0)
    cases = []
    for i, label in enumerate(labels):

        def judge(res, i=i, tag=tag):
            verdict = read_verdict(res.stdout, tag, len(tests))
            if isinstance(verdict, str):  # the whole run failed: say why (the sandbox's reason first)
                return res.reason or verdict
            return verdict[i]

        cases.append(_Case(job if i == 0 else None, judge, label))
    return cases


def _assert_cases(code: str, tests: list[str], setup: str, timeout_s: float) -> list[_Case]:
    """Literal asserts become hidden call cases; the others run in the two-process harness, where
    both sides of the comparison are values the trusted process built (never the candidate's objects)."""
    prelude = (setup + "\n" if setup else "") + code
    split = [split_assert(t) for t in tests]
    hidden = [(t, s) for t, s in zip(tests, split) if s is not None]
    cases = call_cases(prelude, [s[0] for _, s in hidden], [s[1] for _, s in hidden], timeout_s) if hidden else []
    visible = [t for t, s in zip(tests, split) if s is None]
    if visible:
        cases += harness_cases(prelude, visible, setup or "", None, timeout_s, [t[:60] for t in visible])
    return cases


def _pool(sandbox: Sandbox | None):
    if sandbox is None:
        raise ConfigError("code rewards run programs in the run's sandbox: pass sandbox= (a "
                          "rollwise.filter.sandbox.Sandbox; the trainer binds its own to the built-in code rewards)")
    return sandbox.pool


def run_cases(cases_per_completion: list[list[_Case]], threshold: float | list, partial: bool,
              sandbox: Sandbox | None) -> list[Score]:
    """Run every job of every completion in parallel through the sandbox's pool, then score each completion."""
    jobs = [c.job for cases in cases_per_completion for c in cases if c.job is not None]
    results = iter(_pool(sandbox).map(jobs)) if jobs else iter(())
    scores = []
    for k, cases in enumerate(cases_per_completion):
        tau = threshold[k] if isinstance(threshold, list) else threshold
        passed, first_failure, last = 0, "", None
        for case in cases:
            if case.job is not None:
                last = next(results)
            why = case.judge(last)
            passed += not why
            if why and not first_failure:
                first_failure = f"{case.label[:60]}: {why}"
        scores.append(threshold_score(passed, len(cases), 1.0 if tau is None else float(tau), partial, first_failure))
    return scores


def _grade(completions, build, threshold, partial, sandbox) -> list[float]:
    """Build each completion's cases (bad ones score 0 with a reason), run them, score them."""
    all_cases, early = [], {}
    for k, completion in enumerate(completions):
        code = extract_code(completion)
        if not code.strip():
            early[k] = Score(0.0, "no code in the completion")
        elif len(code) > MAX_CODE_CHARS:
            early[k] = Score(0.0, f"program longer than {MAX_CODE_CHARS} characters")
        try:
            all_cases.append([] if k in early else build(k, code))
        except Exception as err:  # a malformed test row is the data's fault; still never raise
            early[k] = Score(0.0, f"could not build the tests ({type(err).__name__}: {err})")
            all_cases.append([])
    scores = run_cases(all_cases, threshold, partial, sandbox)
    return [early.get(k, s) for k, s in enumerate(scores)]


def _taus(pass_threshold, n, default):
    return [default if t is None else t for t in pass_threshold] if pass_threshold is not None else [default] * n


def code_io(prompts, completions, io_cases, pass_threshold=None, threshold=1.0, partial=False,
            timeout_s=PER_TEST_TIMEOUT_S, sandbox: Sandbox | None = None, **_) -> list[float]:
    """stdin/stdout cases (``io_verifier``): ``io_cases`` is a list of ``{"input", "output"}`` per row.

    >>> code_io(["p"], ["print(int(input()) * 2)"], [[{"input": "3", "output": "6"}]])  # doctest: +SKIP
    [1.0]
    """
    return _grade(completions, lambda k, code: _io_cases(code, io_cases[k], timeout_s),
                  _taus(pass_threshold, len(completions), threshold), partial, sandbox)



def code_asserts(prompts, completions, tests, test_setup=None, pass_threshold=None, threshold=1.0, partial=False,
                 timeout_s=PER_TEST_TIMEOUT_S, sandbox: Sandbox | None = None, **_) -> list[float]:
    """MBPP-style assert tests: ``tests`` is a list of ``assert ...`` lines per row."""
    setups = test_setup or [""] * len(completions)
    return _grade(completions, lambda k, code: _assert_cases(code, list(tests[k]), setups[k] or "", timeout_s),
                  _taus(pass_threshold, len(completions), threshold), partial, sandbox)


def _compiles(source: str) -> bool:
    """The dataset's prompt stands alone as Python (HumanEval's: a signature and a docstring), so its
    helper functions can run in the trusted process; compiled here, never executed."""
    try:
        compile(source, "<prompt>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def code_exit(prompts, completions, test, entry_point=None, timeout_s=PER_TEST_TIMEOUT_S * 5,
              sandbox: Sandbox | None = None, **_) -> list[float]:
    """HumanEval-style: ``test`` (+ ``check(entry_point)``) must run to its end without an error.

    The test code runs in the harness's trusted process (``rollwise.filter.harness``) with the
    prompt's own helpers, and calls the completion's ``entry_point`` (every function it defines
    when there is none) in the candidate's process; a pass is the trusted process's verdict, so
    an early ``sys.exit(0)`` or an object that equals everything cannot produce one.
    """

    def build(k, code):
        fenced = bool(_FENCE.search(as_text(completions[k])))
        candidate = code if fenced else as_text(prompts[k]) + as_text(completions[k])  # the body continues the prompt
        names = [entry_point[k]] if entry_point is not None else None
        tests = [test[k] + (f"\ncheck({entry_point[k]})\n" if entry_point is not None else "\n")]
        trusted = as_text(prompts[k]) if entry_point is not None and _compiles(as_text(prompts[k])) else ""
        return harness_cases(candidate, tests, trusted, names, timeout_s, ["test program"])

    return _grade(completions, build, 1.0, False, sandbox)
