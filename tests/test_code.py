"""Code graders (io_verifier, test_threshold), the MBPP/HumanEval loaders and the `code` task."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.filter.code import (
    code_asserts,
    code_exit,
    code_io,
    extract_code,
    normalize_output,
    split_assert,
    threshold_score,
)
from rollwise.filter.registry import builtin_rewards, resolve_rewards
from rollwise.filter.sandbox import Sandbox
from rollwise.tasks.code import CodeConfig, code_fn_reward
from rollwise.train.config import load_run_config

FIXTURES = Path(__file__).parent / "fixtures"
DOUBLE = [{"input": "3", "output": "6"}, {"input": "10\n", "output": "20  \n\n"}]


@pytest.fixture(scope="module")
def sb():
    """The sandbox a run would pass to its code rewards (one per module, closed after)."""
    with Sandbox() as sandbox:
        yield sandbox


def test_threshold_scoring_by_hand():
    # METHODS.md test_threshold: 4 of 5 passed -> 0 at tau = 1.0, 1 at tau = .8
    assert threshold_score(4, 5, 1.0) == 0.0 and threshold_score(4, 5, 0.8) == 1.0
    assert threshold_score(5, 5) == 1.0 and threshold_score(4, 5, partial=True) == 0.8
    assert threshold_score(0, 0).reason == "no tests to run"
    assert threshold_score(3, 5, first_failure="case 1: x").reason == "passed 3/5 tests; first failure: case 1: x"


def test_io_verifier_cases(sb):
    # METHODS.md io_verifier: wrong output -> 0, `while True: pass` -> timeout -> 0, compile error -> 0
    completions = ["n = int(input())\nprint(n * 2)", "print(int(input()) + 3)", "while True: pass", "print(int(input()) *",
                   "```python\nprint(2 * int(input()))\n```", ""]
    scores = code_io(["p"] * 6, completions, [DOUBLE] * 6, timeout_s=0.5, sandbox=sb)
    assert scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert scores[1].reason == "passed 1/2 tests; first failure: case 1: wrong output '13'"
    assert "timed out" in scores[2].reason and "SyntaxError" in scores[3].reason and "no code" in scores[5].reason
    assert normalize_output("a  \nb\t\n\n") == "a\nb"  # trailing whitespace per line stripped
    half = code_io(["p"], ["print(6)"], [DOUBLE], partial=True, sandbox=sb)
    assert half == [0.5]
    assert code_io(["p"], ["print(6)"], [DOUBLE], pass_threshold=[0.5], sandbox=sb) == [1.0]


def test_assert_tests_keep_literal_expectations_outside_the_sandbox(sb):
    assert split_assert("assert f(3) == 9") == ("f(3)", 9)
    assert split_assert("assert f(1) in (1,)") is None and split_assert("x = 1") is None
    tests = [["assert sq(3) == 9", "assert sq(-2) == 4", "assert sq(0) in (0,)"]] * 4
    completions = ["def sq(x): return x * x", "def sq(x): return x * 2", "def sq(x):\n  while True: pass",
                   "def sq(x): return {'x': lambda: 1}"]  # a value that is not a literal
    scores = code_asserts(["p"] * 4, completions, tests, timeout_s=0.3, sandbox=sb)
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert "sq(3): returned 6" in scores[1].reason and "timeout" in scores[2].reason
    assert "non-literal" in scores[3].reason
    # a program that hunts its callers' code for the expected value finds it nowhere: split asserts
    # keep the value out of the sandbox, other asserts run in the harness's trusted process
    hunt = (
        "import sys\ndef sq(x):\n    f = sys._getframe(1)\n    while f:\n"
        "        for c in f.f_code.co_consts:\n"
        "            if c == 9 or (isinstance(c, tuple) and 9 in c):\n                return 9\n"
        "        f = f.f_back\n    return -1\n"
    )
    assert code_asserts(["p"], [hunt], [["assert sq(3) in (9,)"]], sandbox=sb) == [0.0]  # before: 1.0
    assert code_asserts(["p"], [hunt], [["assert sq(3) == 9"]], sandbox=sb) == [0.0]
    honest = code_asserts(["p"], ["def sq(x): return x * x"], [["assert sq(3) in (9,)", "assert sq(2) == sorted([4])[0]"]],
                          sandbox=sb)
    assert honest == [1.0]


def test_exit_code_grading_humaneval_style(sb):
    prompt, test = "def add(a, b):\n", "def check(c):\n    assert c(1, 2) == 3\n"
    scores = code_exit([prompt] * 3, ["    return a + b\n", "    return a - b\n", "```python\ndef add(a, b): return b + a\n```"],
                       [test] * 3, ["add"] * 3, sandbox=sb)
    assert scores == [1.0, 0.0, 1.0] and "assertion failed" in scores[1].reason


def test_bad_output_and_bad_rows_never_raise(sb):
    weird = [None, 12, [{"role": "assistant", "content": "print(6)"}], "\x00\udcff", "x" * 30_000]
    scores = code_io(["p"] * 5, weird, [DOUBLE[:1]] * 5, sandbox=sb)
    assert scores[2] == 1.0 and all(s == 0.0 for i, s in enumerate(scores) if i != 2)
    bad_rows = code_io(["p"], ["print(1)"], [[{"no": "input"}]], sandbox=sb)
    assert bad_rows == [0.0] and "could not build the tests" in bad_rows[0].reason
    assert extract_code("text\n```py\na = 1\n```\nmore\n```python\nb = 2\n```") == "b = 2\n"
    for name in ("code_io", "code_asserts", "code_exit"):
        assert name in builtin_rewards()
    with pytest.raises(ConfigError, match="the run's sandbox"):  # no process-wide pool to fall back on
        code_io(["p"], ["print(6)"], [DOUBLE])
    with pytest.raises(ConfigError, match="the run's sandbox"):
        CodeConfig(eval_size=4).build(seed=0)


@pytest.mark.parametrize("name, path", [("mbpp", "mbpp_tiny.jsonl"), ("humaneval", "humaneval_tiny.jsonl")])
def test_dataset_loaders_and_their_references_pass(name, path, sb):
    cfg = load_run_config(None, [f"task.name={name}", f"task.path={FIXTURES / path}", "task.eval_fraction=0.25"])
    task = cfg.task.build(0, sb)
    prompts = [task.train.get(i) for i in range(len(task.train.prompts))] + task.eval
    assert len(prompts) == len((FIXTURES / path).read_text().splitlines())
    _, judge = resolve_rewards(None, task, sb)
    cols = {k: [p.reward_columns().get(k) for p in prompts] for k in prompts[0].reward_columns()}
    demos = [task.demonstrate(p) for p in prompts]
    assert judge.fn([p.text for p in prompts], demos, **cols) == [1.0] * len(prompts)
    assert judge.fn([p.text for p in prompts], ["pass"] * len(prompts), **cols) == [0.0] * len(prompts)
    if name == "mbpp":
        assert "Your code should pass these tests:\nassert" in prompts[0].text


def test_loader_errors_name_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "t", "code": "c", "test_list": ["assert 1"]}) + "\n" + json.dumps({"text": "t"}) + "\n")
    with pytest.raises(ConfigError, match=r"line 2: row has no field 'test_list'"):
        load_run_config(None, ["task.name=mbpp", f"task.path={bad}"]).task.build(0)
    with pytest.raises(ConfigError, match="task.path: file .* does not exist"):
        load_run_config(None, ["task.name=humaneval", f"task.path={tmp_path / 'none.jsonl'}"]).task.build(0)
    with pytest.raises(ConfigError, match="sandbox.isolation"):
        load_run_config(None, ["task.name=code", "sandbox.isolation=none"])


def test_code_task_prompts_demonstrations_and_hidden_cases(sb):
    task = CodeConfig(eval_size=30).build(seed=0, sandbox=sb)
    prompts = [task.train.get(i) for i in range(40)]
    assert {p.text for p in prompts}.isdisjoint(p.text for p in task.eval)
    p = prompts[0]
    assert p.text.startswith("f(0)=") and p.text.endswith(" f(x)=")
    assert min(p.columns["hidden_x"]) >= 10 and p.text.startswith("f(0)=") and " f(1)=" in p.text  # hidden != shown
    reward = task.rewards["code_fn"]
    cols = {k: [q.columns[k] for q in prompts] for k in ("hidden_x", "hidden_y")}
    assert reward([q.text for q in prompts], [task.demonstrate(q) for q in prompts], **cols) == [1.0] * 40
    # any expression that computes the function passes; the grade is behaviour, not text
    affine = next(q for q in prompts if "*" in q.columns["solution"] and "+" in q.columns["solution"])
    a, b = affine.columns["solution"][2:].split("+")
    one = {k: [affine.columns[k]] for k in ("hidden_x", "hidden_y")}
    assert reward([affine.text], [f" {b}+{a}*x"], **one) == [1.0]
    bad = reward([affine.text] * 4, [" x", " x*", " __import__('os').system('id')", " x\nimport os"], **{k: v * 4 for k, v in one.items()})
    assert bad == [0.0] * 4 and "single expression" in bad[3].reason
    partial = code_fn_reward(partial=True, sandbox=sb)([affine.text], [f" x*{a}"], **one)
    assert 0.0 <= partial[0] < 1.0


def test_code_task_trains_from_the_cli(tmp_path):
    sets = ["task.name=code", "task.eval_size=8", "sft.steps=5", "train.steps=2", "rollout.prompts_per_step=4",
            "rollout.num_generations=4", "rollout.max_new_tokens=12", "train.eval_samples=2", "model.threads=1",
            f"output_dir={tmp_path}", "name=code", "train.checkpoint_every=0"]
    result = CliRunner().invoke(app, ["train", *(arg for s in sets for arg in ("--set", s))])
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (tmp_path / "code" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/code_fn" in m]
    assert len(steps) == 2 and all(m["reward/code_fn/errors"] == 0 for m in steps)


def test_bench_sandbox_cli_smoke(tmp_path):
    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench", "sandbox", "--json", str(out), "--set", "runs=20", "--set", "naive_runs=3",
                                      "--set", "repeats=1"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["pool_exec_s"] > 0 and data["naive_exec_s"] > 0
    assert data["ratio"] == pytest.approx(data["pool_exec_s"] / data["naive_exec_s"], rel=0.02)
