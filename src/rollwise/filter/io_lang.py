"""``io_verifier``: Agnostics, "Learning to Code in Any Programming Language" (2025) — judge a
program only by its stdin/stdout behaviour, one verifier for every language; a short YAML file per
language says how to compile and run it.

``rewards: [{name: io_verifier}]`` with ``io_cases`` (``{"input", "output"}`` per case) and an
optional ``language`` column per row: a shipped language's name or the path of your own YAML
(default ``python``). A YAML has ``file`` (the program's file name), optional ``compile``, ``run``
and ``timeout_s`` (per step, default 2); commands are split like a shell's (no shell runs), with
``{python}`` = the sandbox's interpreter and ``{file}``. For each case the sandbox job writes the
program to ``file`` in its own temp directory, compiles it (a failed compile: 0, "compile error")
and runs it with the case's input on stdin (past ``timeout_s``: killed, 0, "timed out"); stdout
is compared outside the sandbox after stripping trailing whitespace per line
(``code.normalize_output``), and r = 1 only if every case passes (``threshold``/``partial`` as in
``code_io``). Everything the program and its compiler do runs inside ``rollwise.filter.sandbox``.

Shipped languages (``LANGUAGES``): those whose toolchain the Makefile installs — Python only
(``languages/python.yaml``, whose compile step is ``py_compile``). Where we depart: Agnostics'
Lua, Julia, R, OCaml and Fortran need their toolchains installed (write a YAML, e.g.
``file: main.lua``, ``run: lua main.lua``; the sandbox must see the binaries: ``/usr`` is mounted
read-only), and its offline LLM conversion of unit-test datasets to I/O form is not done here.
Showing the paper's multi-language gains needs a bigger model and those toolchains.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from rollwise.config import ConfigError
from rollwise.filter.code import _Case, _describe, _grade, _taus, normalize_output
from rollwise.filter.rewards import as_text
from rollwise.filter.sandbox import Job, Sandbox

LANG_DIR = Path(__file__).with_name("languages")
LANGUAGES = sorted(p.stem for p in LANG_DIR.glob("*.yaml"))
KEYS = ("file", "compile", "run", "timeout_s")
COMPILE_FAILED = 3  # the job's exit status when the compile step fails
_ANY_FENCE = re.compile(r"```[\w+#-]*[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class LanguageSpec:
    file: str
    run: str
    compile: str | None = None
    timeout_s: float = 2.0


def load_language(name: str) -> LanguageSpec:
    """A shipped language by name, or a YAML file's path; unknown keys and missing ones are ConfigErrors."""
    path = LANG_DIR / f"{name}.yaml" if name in LANGUAGES else Path(name)
    if not path.is_file():
        raise ConfigError(f"io_verifier: language {name!r} is neither shipped ({', '.join(LANGUAGES)}) nor a YAML "
                          "file; write one with file, run (and compile, timeout_s)")
    data = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(data) - set(KEYS))
    if unknown or not isinstance(data.get("file"), str) or not isinstance(data.get("run"), str):
        raise ConfigError(f"io_verifier: {path}: keys are {', '.join(KEYS)} (file and run required)"
                          + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
    return LanguageSpec(data["file"], data["run"], data.get("compile"), float(data.get("timeout_s", 2.0)))


# runs inside the sandbox: write the program, compile it, run it on the case's input
_RUNNER = '''
import shlex, subprocess, sys
spec, source, stdin = {spec!r}, {source!r}, {stdin!r}
fmt = {{"python": sys.executable, "file": spec["file"]}}
with open(spec["file"], "w") as f:
    f.write(source)
def step(command, data):
    return subprocess.run(shlex.split(command.format(**fmt)), input=data, capture_output=True, text=True,
                          timeout=spec["timeout_s"])
try:
    if spec["compile"]:
        c = step(spec["compile"], "")
        if c.returncode != 0:
            sys.stderr.write("compile error: " + (c.stderr.strip().splitlines() or [""])[-1][:200])
            sys.exit({failed})
    r = step(spec["run"], stdin)
except subprocess.TimeoutExpired:
    sys.stderr.write("timed out")
    sys.exit(124)
sys.stdout.write(r.stdout)
sys.stderr.write(r.stderr[-400:])
sys.exit(r.returncode)
'''


def extract_program(completion) -> str:
    """The last fenced block of any language, else the text."""
    text = as_text(completion)
    blocks = _ANY_FENCE.findall(text)
    return blocks[-1] if blocks else text


def lang_cases(code: str, cases: list[dict], spec: LanguageSpec) -> list[_Case]:
    out = []
    budget = spec.timeout_s * (2 if spec.compile else 1) + 2.0  # the job's own limit, past both steps
    for i, case in enumerate(cases):
        expected = normalize_output(str(case["output"]))

        def judge(res, expected=expected):
            if res.returncode == 124:
                return "timed out"
            if res.returncode == COMPILE_FAILED and res.stderr.startswith("compile error"):
                return res.stderr[:160]
            if res.returncode != 0 or res.timed_out or res.reason:
                return _describe(res)
            got = normalize_output(res.stdout)
            return "" if got == expected else f"wrong output {got[:60]!r}"

        runner = _RUNNER.format(spec=asdict(spec), source=code, stdin=str(case.get("input", "")),
                                failed=COMPILE_FAILED)
        out.append(_Case(Job(runner, "", budget), judge, f"case {i}"))
    return out


def io_verifier(prompts, completions, io_cases, language=None, pass_threshold=None, threshold=1.0, partial=False,
                sandbox: Sandbox | None = None, **_) -> list[float]:
    """stdin/stdout cases in any language with a YAML (``io_verifier``; Agnostics): ``io_cases`` per row,
    ``language`` per row (a shipped name or a YAML path; default python); r = 1 only if every case passes."""
    specs = [load_language(lang or "python") for lang in (language or [None] * len(completions))]
    programs = [extract_program(c) for c in completions]
    return _grade(programs, lambda k, _: lang_cases(programs[k], io_cases[k], specs[k]),
                  _taus(pass_threshold, len(completions), threshold), partial, sandbox)
