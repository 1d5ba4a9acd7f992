"""io_verifier (Agnostics; METHODS.md): per-language YAML (file, compile, run, timeout_s) in the sandbox;
stdout compared after stripping trailing whitespace per line; r = 1 only if every case passes.
Test: wrong output → 0, `while True: pass` → timeout → 0, compile error → 0."""

import pytest

from rollwise.config import ConfigError
from rollwise.filter.io_lang import LANGUAGES, load_language
from rollwise.filter.registry import builtin_rewards
from rollwise.filter.sandbox import Sandbox

CASES = [{"input": "3", "output": "6  \n"}, {"input": "5", "output": "10"}]


@pytest.fixture(scope="module")
def sb():
    with Sandbox() as sandbox:
        yield sandbox


def test_the_shipped_languages_are_the_installed_toolchains():
    assert sorted(LANGUAGES) == ["python"]  # the Makefile installs Python only (.venv); others: your own YAML
    py = load_language("python")
    assert py.file == "solution.py" and py.compile and py.run and py.timeout_s == 2.0


def test_the_four_cases(sb):
    reward = builtin_rewards(sb)["io_verifier"]
    right = "```python\nprint(int(input()) * 2)\n```"
    wrong = "print(int(input()) * 2 + 1)"
    loop = "while True: pass"
    broken = "print(int(input()) * 2"  # a syntax error: the compile step (py_compile) fails
    scores = reward(["p"] * 4, [right, wrong, loop, broken], [CASES] * 4, language=["python"] * 4)
    assert scores == [1.0, 0.0, 0.0, 0.0]
    reasons = [getattr(s, "reason", "") for s in scores]
    assert "timed out" in reasons[2] and "compile" in reasons[3]


def test_one_failed_case_is_zero(sb):
    reward = builtin_rewards(sb)["io_verifier"]
    half = "x = int(input())\nprint(6 if x == 3 else 0)"  # case 0 passes, case 1 fails
    assert reward(["p"], [half], [CASES]) == [0.0]  # no language column: python


def test_your_own_yaml(sb, tmp_path):
    spec = tmp_path / "py_upper.yaml"
    spec.write_text("file: prog.py\nrun: '{python} prog.py'\ntimeout_s: 1\n")
    reward = builtin_rewards(sb)["io_verifier"]
    assert reward(["p"], ["print(input().upper())"], [[{"input": "ab", "output": "AB"}]],
                  language=[str(spec)]) == [1.0]


def test_bad_yaml_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("file: a.lua\ncompiler: luac a.lua\nrun: lua a.lua\n")
    with pytest.raises(ConfigError, match="compiler"):
        load_language(str(bad))
    with pytest.raises(ConfigError, match="cobol"):
        load_language("cobol")
