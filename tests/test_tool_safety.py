"""Model output and environment code cannot hang or crash the trainer (issue 32): tool-call parsing
never raises, the calculator refuses results it cannot afford, tool calls end at ``tool_timeout``
whatever the tool does (a worker process), and an environment that fails scores its episode 0."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from bounded import bounded
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.episode import EpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks.environment import episode_envs
from rollwise.tasks.tool_calls import FORMATS, ToolCall, parse_calls
from rollwise.types import Prompt
from hung_tools import call_that_holds_the_gil, stubborn_envs

HERMES, PLAIN = FORMATS["hermes"], FORMATS["plain"]
HERE = __name__  # environments below are loaded by rollout.environment as "<this module>:Class"


# -- 1. parsing never raises ---------------------------------------------------------------------
def test_deeply_nested_json_is_a_parse_error_not_a_recursion_error():
    deep = "[" * 200_000 + "]" * 200_000
    (call,) = HERMES.parse(f'<tool_call>{{"name": "f", "arguments": {deep}}}</tool_call>')
    assert call.error == "the tool call is nested too deeply to read"
    (call,) = HERMES.parse(f'<tool_call>{{"name": "f", "arguments": "{deep}"}}</tool_call>')  # the string form too
    assert call.error is not None


def test_a_nul_byte_in_a_plain_call_is_a_parse_error(monkeypatch):
    (call,) = PLAIN.parse('<call>calculate("1\x00+1")</call>')
    assert call.error is not None and call.name == ""
    import ast

    def refuse_nul(source, *args, **kwargs):  # what ast.parse does with a NUL byte before CPython 3.11.4ish
        if "\x00" in source:
            raise ValueError("source code string cannot contain null bytes")
        return parse(source, *args, **kwargs)

    parse = ast.parse
    monkeypatch.setattr(ast, "parse", refuse_nul)
    (call,) = PLAIN.parse('<call>calculate("1\x00+1")</call>')
    assert call.error == "cannot read the tool call (ValueError: source code string cannot contain null bytes)"


@pytest.mark.parametrize("body", ["-" * 100_000 + "1", "1+" * 100_000 + "1"], ids=["memory", "recursion"])
def test_a_plain_call_the_parser_cannot_hold_is_a_parse_error(body):
    (call,) = PLAIN.parse(f"<call>f({body})</call>")
    assert call.name == "" and call.error.startswith(("cannot read the tool call", "the tool call is nested"))


def test_a_format_that_raises_is_one_error_call():
    class Buggy(type(PLAIN)):
        def parse(self, text):
            raise RecursionError("maximum recursion depth exceeded")

    assert parse_calls(Buggy(), "x") == [ToolCall("", error="the tool call is nested too deeply to read")]


@settings(derandomize=True, max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list('<>/{}[]()"\\,:=\x00 abcfn1') + ["<tool_call>", "</tool_call>", "<call>",
                                                                      "</call>", '"name"', '"arguments"']),
                max_size=60).map("".join))
def test_parsing_any_text_never_raises(text):
    for fmt in (HERMES, PLAIN):
        assert all(isinstance(c, ToolCall) for c in fmt.parse(text))


# -- 2. the calculator's guard bounds the result, not the exponent --------------------------------
def test_the_calculator_refuses_a_tower_of_powers_before_computing_it():
    """In a subprocess: before the guard bounded results, this computed 10 ** 10 ** 9 holding the GIL."""
    code = ("from rollwise.tasks.envs import arithmetic\n"
            "for e in ('((10**1000)**1000)**1000', '(10**1000)*(10**1000)*(10**1000)*(10**1000)*(10**1000)'):\n"
            "    try:\n        arithmetic(e)\n    except ValueError as err:\n        print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.count("too large") == 2, out.stderr[-500:]


def test_the_calculator_still_computes_what_it_can_afford():
    from rollwise.tasks.envs import arithmetic

    assert arithmetic("10 ** 1000") == 10**1000 and arithmetic("(-3) ** 5") == -243
    assert arithmetic("2 ** 13000 // 2 ** 12999") == 2 and arithmetic("10 ** -3") == 0.001


# -- 3. tool calls end at tool_timeout whatever the tool does --------------------------------------
def in_fresh_interpreter(expression: str, seconds: float = 120.0) -> str:
    """``repr(expression)`` evaluated with ``hung_tools`` as ``t`` in a new interpreter, killed past
    ``seconds``: were the fix to regress, a big-int power would run in the calling process holding the
    GIL, and no thread's join could time out."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import hung_tools as t; "
            f"from rollwise.tasks.tool_calls import ToolCall; print(repr({expression}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=seconds)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_tool_in_a_pure_python_loop_ends_at_tool_timeout():
    first, error, text, restarts, after = bounded(lambda: call_that_holds_the_gil(ToolCall("spin")))
    assert (error, text) == ("timeout", "Error: spin timed out after 1 s")
    # stopped, not abandoned: no thread of this process is left spinning (a thread timeout leaves one)
    assert not [t for t in threading.enumerate() if t.name.startswith("tool-")]
    # the worker was restarted and the episode rebuilt (reset + its calls): its state is intact
    assert (first, restarts, after) == ("2", 1, "5")


def test_a_tool_in_a_big_int_power_ends_at_tool_timeout():
    said = in_fresh_interpreter('t.call_that_holds_the_gil(ToolCall("power", {"exponent": 10**9}))')
    assert said == "('2', 'timeout', 'Error: power timed out after 1 s', 1, '5')"


def test_a_neighbours_timeout_does_not_cost_another_episode_its_state():
    envs = stubborn_envs()
    a, b = envs(), envs()
    a.reset({})
    b.reset({})
    a.call(ToolCall("add", {"k": 10}))
    b.call(ToolCall("add", {"k": 1}))
    assert bounded(lambda: b.call(ToolCall("spin"))).error == "timeout"
    assert bounded(lambda: b.call(ToolCall("die"))).error == "raised"  # a worker that died: restarted too
    assert a.call(ToolCall("add", {"k": 1})).text == "11" and b.call(ToolCall("add", {"k": 1})).text == "2"
    assert a.failure is None and b.failure is None


def test_the_worker_exits_when_its_trainer_is_killed():
    """A trainer killed with SIGKILL runs no cleanup: its worker must see the pipe close and exit."""
    import os
    import time

    code = (f"import os, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import hung_tools as t; "
            "envs = t.stubborn_envs(); env = envs(); env.reset({}); print(envs.worker._proc.pid, flush=True); "
            "os.kill(os.getpid(), 9)")
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(bounded(trainer.stdout.readline, limit=120))
    trainer.wait(60)
    trainer.stdout.close()

    def running() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 60
    while running() and time.monotonic() < deadline:  # a bound on the wait, not a timed assertion
        time.sleep(0.05)
    if running():  # clean up after the failure: the worker is this test's process
        os.kill(pid, 9)
        pytest.fail(f"the environment worker {pid} outlived its trainer")


def test_a_worker_round_trip_is_cheap():
    """The tiny calculator recipes make thousands of calls: a persistent worker, not a process per call.
    (A count, not a time: every call goes to the one worker started by the first.)"""
    envs = episode_envs("calculator", 5.0, 200)
    env = envs()
    env.reset({})
    pid = envs.worker._proc.pid
    results = [env.call(ToolCall("calculate", {"expression": f"{i} * 3"})).text for i in range(200)]
    assert results == [str(3 * i) for i in range(200)]
    assert envs.worker.restarts == 0 and envs.worker._proc.pid == pid


def tower_script(prompt_text: str) -> str:
    return "giving up" if "<result>" in prompt_text else '<call>calculate("((10**1000)**1000)**1000")</call>'


class ScriptedEngine:
    """A TokenEngine whose "model" writes ``script(prompt_text)`` then EOS (log-prob -0.5 per id)."""

    version = 0

    def __init__(self, tok, script):
        self.tok, self.script, self.queue, self.calls = tok, script, {}, 0

    def submit(self, requests):
        handles = []
        for r in requests:
            text = self.tok.decode(r.prompt_ids, skip_special_tokens=False)
            ids = (self.tok(self.script(text), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])
            ids = ids[: r.params.max_new_tokens]
            reason = "stop" if ids[-1] == self.tok.eos_token_id else "length"
            self.calls += 1
            h = self.calls
            self.queue[h] = Completion(h, list(r.prompt_ids), ids, [-0.5] * len(ids), [0] * len(ids), reason)
            handles.append(h)
        return handles

    def run_until(self, condition=None):
        done, self.queue = self.queue, {}
        return done


def episodes(tok, envs, max_new_tokens=200):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    return EpisodeSampler(params, tok, envs, PLAIN, max_turns=3)


def test_the_calculator_environment_answers_a_tower_of_powers_with_an_error():
    """The issue's case: the ``calculator`` environment, ``tool_timeout`` 2 s, ((10**1000)**1000)**1000."""
    tok = char_tokenizer()
    sampler = episodes(tok, episode_envs("calculator", 2.0, 2000))
    engine = ScriptedEngine(tok, tower_script)
    (group,), metrics = bounded(lambda: sampler.generate(engine, [Prompt("p", "q ")], [1], 0))
    (r,) = group.rollouts
    assert "too large" in r.messages[1]["content"] and r.failure is None and metrics["episode/raised"] == 1.0


def test_an_episode_whose_tool_hangs_goes_on_after_tool_timeout():
    """The model is told the call timed out and answers; the episode is scored, nothing hangs."""
    call = "spin()"
    tok = char_tokenizer()
    script = lambda text: "#0" if "<result>" in text else f"<call>{call}</call>"  # noqa: E731
    (group,), metrics = bounded(lambda: episodes(tok, stubborn_envs(timeout=1.0)).generate(
        ScriptedEngine(tok, script), [Prompt("p", "q ")], [2], 0))
    for r in group.rollouts:
        assert [m["content"] for m in r.messages] == [f"<call>{call}</call>", "Error: spin timed out after 1 s", "#0"]
        assert r.failure is None and r.finish_reason == "stop"
    assert metrics["episode/timeout"] == 2.0


# -- 4. an environment that fails: the episode scores 0 with the reason, the run goes on ---------------
class FailsOnBadRows:
    def reset(self, **row):
        if row.get("bad"):
            raise KeyError("secret")

    def ping(self) -> str:
        """Answer pong."""
        return "pong"


class FailsAfterTheFirst:
    """Its constructor raises from the second instance on (the first is the schema probe at load), and
    in the worker process always (a fresh process: the trainer's count is not there)."""

    made = 0

    def __init__(self):
        type(self).made += 1
        if type(self).made > 1 or multiprocessing.parent_process() is not None:
            raise RuntimeError("no licence left")

    def reset(self, **row):
        return None

    def ping(self) -> str:
        """Answer pong."""
        return "pong"


class FailingReward(FailsOnBadRows):
    def get_reward(self) -> float:
        raise ZeroDivisionError("division by zero")


def ping_script(prompt_text: str) -> str:
    return "#1" if "<result>" in prompt_text else "<call>ping()</call>"


@pytest.mark.parametrize("where", ["worker", "in_process"])
def test_an_environment_whose_reset_or_constructor_raises_scores_its_episode_zero(where, monkeypatch):
    from rollwise.filter.rewards import RewardFn, score_groups
    from rollwise.filter.arith import arith_reward

    if where == "in_process":
        monkeypatch.setattr(FailsOnBadRows, "in_process", True, raising=False)
        monkeypatch.setattr(FailsAfterTheFirst, "in_process", True, raising=False)
    monkeypatch.setattr(FailsAfterTheFirst, "made", 0)
    tok = char_tokenizer()
    prompts = [Prompt("ok", "q ", answer="1"), Prompt("bad", "q ", answer="1", columns={"bad": True})]
    sampler = episodes(tok, episode_envs(f"{HERE}:FailsOnBadRows", 5.0, 200))
    groups, metrics = sampler.generate(ScriptedEngine(tok, ping_script), prompts, [1, 2], 0)
    score_groups(groups, [RewardFn("arith", arith_reward)])
    good, bad = groups[0].rollouts[0], groups[1].rollouts
    assert good.failure is None and good.reward == 1.0 and good.messages[1]["content"] == "pong"
    for r in bad:  # not sampled at all: nothing to train, 0 with the reason
        assert r.completion_ids == [] and r.reward == 0.0
        assert r.failure == "FailsOnBadRows.reset raised KeyError: 'secret' (on a row with columns ['answer', 'bad'])"
        assert r.reward_reasons["failure"] == r.failure
    assert metrics["episode/env_failed"] == 2.0
    broken = episodes(tok, episode_envs(f"{HERE}:FailsAfterTheFirst", 5.0, 200))
    (group,), metrics = broken.generate(ScriptedEngine(tok, ping_script), prompts[:1], [2], 0)
    said = "FailsAfterTheFirst() raised RuntimeError: no licence left"
    assert all(r.failure.startswith(said) for r in group.rollouts)
    assert metrics["episode/env_failed"] == 2.0


def test_a_get_reward_that_raises_fails_the_episode_with_the_reason():
    tok = char_tokenizer()
    sampler = episodes(tok, episode_envs(f"{HERE}:FailingReward", 5.0, 200))
    (group,), _ = sampler.generate(ScriptedEngine(tok, ping_script), [Prompt("p", "q ")], [1], 0)
    (r,) = group.rollouts
    assert r.failure == "FailingReward.get_reward raised ZeroDivisionError: division by zero" and r.env_reward is None


def test_an_environment_whose_only_constructor_raises_is_a_config_error():
    class Never:
        def __init__(self):
            raise OSError("no such device")

        def reset(self, **row):
            return None

    import types

    module = types.ModuleType("h3_never_env")
    module.Never = Never
    sys.modules["h3_never_env"] = module
    try:
        with pytest.raises(ConfigError, match=r"rollout.environment: 'h3_never_env:Never': Never\(\) raised OSError"):
            episode_envs("h3_never_env:Never", 1.0, 100)
    finally:
        del sys.modules["h3_never_env"]


# -- 5. python_tool's sandbox is built when the environment loads, from the run's settings ------------
@pytest.fixture
def no_bubblewrap(monkeypatch):
    """This machine as one without bubblewrap: the sandbox's availability check reports it missing."""
    import dataclasses

    from rollwise.filter.sandbox import pool

    real = pool.detect
    monkeypatch.setattr(pool, "detect", lambda *a, **k: dataclasses.replace(
        real(*a, **k), bwrap=None, bwrap_note="not installed (simulated)"))


def test_python_tool_without_its_sandbox_is_a_config_error_at_load(no_bubblewrap):
    with pytest.raises(ConfigError, match=r"rollout.environment=python_tool runs the model's code in the run's sandbox"
                                          r".*bubblewrap: not installed \(simulated\).*sandbox.isolation=best_effort"):
        episode_envs("python_tool", 5.0, 200)


def test_python_tool_uses_the_runs_sandbox_settings(tmp_path, no_bubblewrap):
    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    args = [f"output_dir={tmp_path}", "rollout.environment=python_tool", "model.threads=1", "train.eval_samples=0"]
    with pytest.raises(ConfigError, match="sandbox.isolation=best_effort"):
        with Trainer(load_run_config(None, args)) as trainer:
            trainer.prepare()
    with Trainer(load_run_config(None, [*args, "sandbox.isolation=best_effort", "sandbox.workers=1"])) as trainer:
        trainer.prepare()  # the run's choice of weaker isolation: the tool runs in the run's own sandbox
        env = trainer.generator.envs()
        assert env.env.sandbox is trainer.sandbox and trainer.sandbox.started
        env.reset({})
        assert env.call(ToolCall("run_python", {"code": "print(6 * 7)"})).text == "42"


class FailsOnEveryOtherEpisode:
    """``reset`` raises on every second episode (counted in the worker process, where instances live)."""

    resets = 0

    def reset(self, **row):
        type(self).resets += 1
        if type(self).resets % 2 == 0:
            raise ValueError("the simulator crashed")

    def ping(self) -> str:
        """Answer pong."""
        return "pong"


def test_training_goes_on_when_environments_fail(tmp_path):
    """The run's view: failed episodes are counted, score 0 with the reason, train nothing; the steps run."""
    import torch

    from rollwise.train.config import load_run_config
    from rollwise.train.loop import Trainer

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "task.max_digits=2", "task.eval_size=2",
                                 "rollout.prompts_per_step=2", "rollout.num_generations=4",
                                 "rollout.max_new_tokens=24", f"rollout.environment={HERE}:FailsOnEveryOtherEpisode",
                                 "optim.micro_batch_size=8", "model.threads=1", "train.eval_samples=0",
                                 "train.eval_every=0", "optim.lr=1e-2"])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        from rollwise.filter.rewards import RewardFn  # a reward with signal for a random model: even length

        trainer.reward_fns = [RewardFn("even", lambda completions, **_: [float(len(c) % 2 == 0) for c in completions])]
        before = [p.detach().clone() for p in trainer.model.parameters()]
        metrics = [trainer.step() for _ in range(2)]
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    for m in metrics:  # 8 episodes a step, every second one failed at reset
        assert m["episode/env_failed"] == 4.0 and m["episodes/failed"] == 4.0
