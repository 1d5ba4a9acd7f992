"""`rollwise eval` on an environment task reports tool use beside accuracy (issue 35 item 5): tool calls per
episode, the share of calls that could not be parsed, the share answered with an error, turns per episode,
failed episodes — counted by hand on a scripted episode set."""

from __future__ import annotations

import json
import re

import pytest
from test_episodes import ScriptedEngine, sampler
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.eval.accuracy import evaluate
from rollwise.filter.rewards import RewardFn
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks.envs import Calculator
from rollwise.types import Prompt

# per prompt: the model's first turn (a later turn, after a result, answers)
FIRST_TURN = {
    "A": '<call>calculate("12*34")</call>',  # one call, it runs
    "B": "<call>calculate(12*</call>",  # one call, unparseable
    "C": "408",  # no call: answers at once
    "D": '<call>calculate("1/0")</call>',  # one call, the tool raises
    "E": '<call>calculate("2+2")</call><call>calculate("3+3")</call>',  # two calls, both run
    "F": "never sampled",  # its environment fails at reset: no turn
}


def script(text: str) -> str:
    return "408" if "<result>" in text else FIRST_TURN[re.search(r"([A-F]): 12", text).group(1)]


class FlakyCalculator(Calculator):
    """The calculator, but reset raises on the row whose answer is "boom" (that episode fails)."""

    def reset(self, **row):
        if row.get("answer") == "boom":
            raise KeyError("boom")
        return None


def exact(prompts, completions, answer, **_):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


PROMPTS = [Prompt(k, f"{k}: 12*34=", answer="boom" if k == "F" else "408") for k in FIRST_TURN]


@pytest.fixture(scope="module")
def result():
    tok = char_tokenizer()
    episodes = sampler(tok, env=FlakyCalculator, max_new_tokens=400, max_turns=3)
    return evaluate(ScriptedEngine(tok, script), PROMPTS, RewardFn("exact", exact), tok.decode, max_new_tokens=400,
                    stop_token_ids=[tok.eos_token_id], episodes=episodes, keep=6)


def test_tool_use_rates_are_the_hand_counts(result):
    """6 episodes; 5 calls (A 1, B 1, D 1, E 2); 1 unparseable (B), 1 answered with an error (D); turns
    2+2+1+2+2+0 = 9; 1 failed episode (F). Accuracy: A B C D E answer 408, F scores 0."""
    m = result.metrics()
    assert m["eval/accuracy"] == pytest.approx(5 / 6)
    assert m["eval/tool_calls_mean"] == pytest.approx(5 / 6)
    assert m["eval/parse_failure_rate"] == pytest.approx(1 / 5)
    assert m["eval/call_error_rate"] == pytest.approx(1 / 5)
    assert m["eval/turns_mean"] == pytest.approx(9 / 6)
    assert m["eval/failed_episodes"] == pytest.approx(1 / 6)


def test_the_printed_table_says_the_same(result):
    rows = dict(result.table())
    assert rows["accuracy (greedy)"] == "83.3%"
    assert rows["tool calls per episode"] == "0.833"
    assert rows["unparseable tool calls"] == "20.0% of tool calls"
    assert rows["tool calls answered with an error"] == "20.0% of tool calls"
    assert rows["turns per episode"] == "1.5"
    assert rows["failed episodes"] == "16.7% (1 of 6)"


def test_the_rates_from_a_generate_call_counts():
    """The rates are per call only when there were calls: 0 calls leaves them out (not a vacuous 0%)."""
    from rollwise.generate.episode import tool_use_metrics

    counts = {"tool_calls": 4, "parse": 1, "unknown_tool": 1, "bad_arguments": 0, "raised": 1, "timeout": 1,
              "truncated": 3}
    assert tool_use_metrics(counts, episodes=8) == {"episode/tool_calls_mean": 0.5, "episode/parse_failure_rate": 0.25,
                                                    "episode/call_error_rate": 0.75}
    assert tool_use_metrics(dict.fromkeys(counts, 0), episodes=8) == {"episode/tool_calls_mean": 0.0}


class OneShot(ScriptedEngine):
    """The scripted engine as single-completion eval drives it (``generate``)."""

    def generate(self, requests):
        handles = self.submit(requests)
        done = self.run_until()
        return [done[h] for h in handles]


def test_single_completions_report_no_tool_use():
    """A task without an environment: accuracy as before, and no tool-use keys."""
    tok = char_tokenizer()
    prompts = [Prompt("p", "A: 12*34=", answer="408")]
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    res = evaluate(OneShot(tok, lambda text: "408"), prompts, RewardFn("exact", exact), decode,
                   max_new_tokens=8, stop_token_ids=[tok.eos_token_id])
    assert res.metrics() == {"eval/accuracy": 1.0, "eval/mean_length": 4.0}
    assert "tool calls per episode" not in dict(res.table())


def test_cli_eval_on_the_calculator_recipe_prints_and_writes_tool_use(tmp_path):
    """The tiny model on recipes/tiny_calculator.yaml (untrained: it may never call): the table and the JSON
    carry the tool-use lines; the per-call rates only when a call was made."""
    out = tmp_path / "eval.json"
    sets = [f"output_dir={tmp_path}", "task.eval_size=4", "rollout.max_new_tokens=24", "train.eval_samples=0"]
    args = ["eval", "recipes/tiny_calculator.yaml", "--json", str(out), *[x for s in sets for x in ("--set", s)]]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())
    assert {"eval/accuracy", "eval/tool_calls_mean", "eval/turns_mean", "eval/failed_episodes"} <= set(metrics)
    assert ("eval/parse_failure_rate" in metrics) == (metrics["eval/tool_calls_mean"] > 0)
    for label in ("accuracy (greedy)", "tool calls per episode", "turns per episode", "failed episodes"):
        assert label in res.output


def test_a_harness_eval_reports_model_calls_and_failed_episodes():
    """A harness calls its tools out of sight: its eval says model calls per episode and failed episodes."""
    from rollwise.eval.tool_use import table_rows, tool_use
    from rollwise.types import Rollout, RolloutGroup

    rollouts = [Rollout("p", [1], [2], [0.0], [0], "stop", failure=f) for f in (None, "the harness raised", None, None)]
    got = tool_use({"harness/calls_mean": 2.5, "harness/failed": 0.25}, [RolloutGroup(Prompt("p", "x"), rollouts)])
    assert got == {"eval/model_calls_mean": 2.5, "eval/failed_episodes": 0.25}
    rows = dict(table_rows({"eval/accuracy": 0.5, "eval/mean_length": 3.0} | got, prompts=4))
    assert rows["model calls per episode"] == "2.5" and rows["failed episodes"] == "25.0% (1 of 4)"
    assert "tool calls per episode" not in rows
