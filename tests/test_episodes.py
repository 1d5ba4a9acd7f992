"""Multi-turn episodes (issue 24): tool-call formats, tool containment, the episode loop, the mask."""

from __future__ import annotations

import time

import pytest

from rollwise.config import ConfigError
from rollwise.engine.engine import Completion
from rollwise.engine.sampling import SamplingParams
from rollwise.generate.episode import EpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks.environment import EpisodeEnv, call_tool, load_environment, tools_of
from rollwise.tasks.envs import Calculator, GuessNumber, arithmetic
from rollwise.tasks.tool_calls import FORMATS, ToolCall, tool_format
from rollwise.types import Prompt

HERMES, PLAIN = FORMATS["hermes"], FORMATS["plain"]


# -- formats ----------------------------------------------------------------------------------
def test_hermes_reads_one_or_several_calls():
    text = ('I will call.<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>'
            '<tool_call>{"name": "guess", "arguments": "{\\"number\\": 5}"}</tool_call>')
    assert HERMES.parse(text) == [ToolCall("calculate", {"expression": "2+2"}), ToolCall("guess", {"number": 5})]
    assert HERMES.parse("no call here") == []


@pytest.mark.parametrize("body, says", [
    ("{not json}", "not valid JSON"),
    ('{"arguments": {}}', '"name" string'),
    ('{"name": "f", "arguments": [1]}', "must be a JSON object"),
    ('{"name": "f", "arguments": "[1"}', "not a JSON object"),
])
def test_hermes_malformed_calls_come_back_with_a_reason(body, says):
    (call,) = HERMES.parse(f"<tool_call>{body}</tool_call>")
    assert call.error is not None and says in call.error


def test_unclosed_calls_are_errors_not_silence():
    assert HERMES.parse('<tool_call>{"name": "f"')[0].error.startswith("a <tool_call> without")
    assert PLAIN.parse("<call>f(1)")[0].error.startswith("a <call> without")


def test_plain_reads_literals_and_never_evaluates():
    assert PLAIN.parse('x<call>calculate("3*4")</call>y<call>f(1, k=[2])</call>') == [
        ToolCall("calculate", {}, ("3*4",)), ToolCall("f", {"k": [2]}, (1,))]
    (bad,) = PLAIN.parse("<call>f(__import__('os').system('true'))</call>")
    assert bad.error == "arguments must be literals (numbers, strings, lists, dicts)"
    assert PLAIN.parse("<call>1 +</call>")[0].error.startswith("cannot read the call")


def test_auto_format_follows_the_chat_template():
    tok = char_tokenizer()
    assert tool_format("auto", tok) is PLAIN
    with pytest.raises(ValueError, match="has none; use rollout.tool_format=plain"):
        tool_format("hermes", tok)


# -- tools --------------------------------------------------------------------------------------
class Hostile:
    def reset(self, **row):
        return None

    def slow(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "woke"

    def boom(self) -> str:
        """Raise."""
        raise RuntimeError("tool bug")

    def huge(self) -> str:
        """Ten megabytes."""
        return "x" * 10_000_000


def test_tools_come_from_public_methods_with_their_schemas():
    tools = tools_of(Calculator())
    assert list(tools) == ["calculate"]
    fn = tools["calculate"].schema["function"]
    assert fn["name"] == "calculate" and fn["parameters"]["required"] == ["expression"]


def test_a_tool_without_a_docstring_is_a_config_error():
    class NoDoc:
        def reset(self, **row):
            return None

        def tool(self, x: int) -> int:
            return x

    with pytest.raises(ConfigError, match="NoDoc.tool: cannot build its schema"):
        tools_of(NoDoc())


def test_failing_tools_become_messages_with_their_kind():
    tools = tools_of(Hostile())
    unknown = call_tool(tools, ToolCall("nope"), 1.0, 100)
    assert unknown.error == "unknown_tool" and "boom, huge, slow" in unknown.text
    assert call_tool(tools, ToolCall("slow", {"minutes": 1}), 1.0, 100).error == "bad_arguments"
    raised = call_tool(tools, ToolCall("boom"), 1.0, 100)
    assert raised.error == "raised" and "RuntimeError: tool bug" in raised.text
    hung = call_tool(tools, ToolCall("slow", {"seconds": 30.0}), 0.05, 100)  # the tool really ran and hung
    assert hung.error == "timeout" and "timed out after 0.05 s" in hung.text
    big = call_tool(tools, ToolCall("huge"), 5.0, 100)
    assert big.truncated and len(big.text) < 200 and "9999900 more characters cut" in big.text
    assert call_tool(tools, ToolCall("x", error="bad json"), 1.0, 100).error == "parse"


def test_calculator_is_exact_and_refuses_code():
    assert arithmetic("123456789 * 987654321") == 121932631112635269
    assert Calculator().calculate("(12 + 7) * 3") == "57"
    for bad in ("__import__('os')", "2 ** 10 ** 9", "x + 1"):
        with pytest.raises(ValueError):
            arithmetic(bad)


def test_guess_number_answers_and_scores():
    env = GuessNumber()
    env.reset(secret=42)
    assert [env.guess(50), env.guess(30), env.guess(42)] == ["lower", "higher", "correct"]
    assert env.get_reward() == 1.0 and env.observation_key() == "50:lower|30:higher|42:correct"


def test_load_environment_names_the_problem():
    assert load_environment("calculator") is Calculator
    with pytest.raises(ConfigError, match="neither a built-in"):
        load_environment("nothing")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_environment("no_such_module_xyz:Env")
    with pytest.raises(ConfigError, match="no reset"):
        load_environment("rollwise.tasks.envs:arithmetic")


# -- the episode loop, with a scripted "model" ---------------------------------------------------
class ScriptedEngine:
    """A TokenEngine whose "model" writes ``script(prompt_text) -> text`` then EOS (log-prob -0.5 per id)."""

    version = 0

    def __init__(self, tok, script):
        self.tok, self.script, self.queue, self.prompts = tok, script, {}, []

    def submit(self, requests):
        handles = []
        for r in requests:
            text = self.tok.decode(r.prompt_ids, skip_special_tokens=False)
            self.prompts.append(text)
            ids = self.tok(self.script(text), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            ids = ids[: r.params.max_new_tokens]
            reason = "stop" if ids[-1] == self.tok.eos_token_id else "length"
            h = len(self.prompts)
            self.queue[h] = Completion(h, list(r.prompt_ids), ids, [-0.5] * len(ids), [0] * len(ids), reason)
            handles.append(h)
        return handles

    def run_until(self, condition=None):
        done, self.queue = self.queue, {}
        return done


def calculator_script(prompt_text: str) -> str:
    return "408" if "<result>" in prompt_text else '<call>calculate("12*34")</call>'


def sampler(tok, env=Calculator, max_new_tokens=64, max_turns=4):
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tok.eos_token_id,))
    return EpisodeSampler(params, tok, lambda: EpisodeEnv(env(), 5.0, 2000), PLAIN, max_turns=max_turns)


def test_a_scripted_episode_is_exactly_the_sampled_and_inserted_ids():
    tok = char_tokenizer()
    prompt = Prompt("p0", "What is 12*34? ", answer="408")
    (group,), metrics = sampler(tok).generate(ScriptedEngine(tok, calculator_script), [prompt], [1], seed=0)
    (r,) = group.rollouts
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    turn1, inserted, turn2 = ids('<call>calculate("12*34")</call>') + [eos], ids("<result>408</result>"), ids("408") + [eos]
    assert r.completion_ids == turn1 + inserted + turn2
    assert r.loss_weights == [1] * len(turn1) + [0] * len(inserted) + [1] * len(turn2)
    assert r.behavior_logprobs == [-0.5] * len(turn1) + [0.0] * len(inserted) + [-0.5] * len(turn2)
    assert [(t.start, t.end) for t in r.turns] == [(0, len(turn1)), (len(turn1 + inserted), len(r.completion_ids))]
    assert r.messages == [{"role": "assistant", "content": '<call>calculate("12*34")</call>'},
                          {"role": "tool", "name": "calculate", "content": "408"},
                          {"role": "assistant", "content": "408"}]
    assert r.finish_reason == "stop" and metrics["episode/tool_calls"] == 1.0


def test_errors_are_counted_and_turns_are_bounded():
    tok = char_tokenizer()
    script = lambda text: "<call>nope(1)</call>"  # noqa: E731 — a model that never stops calling a missing tool
    (group,), metrics = sampler(tok, max_new_tokens=400, max_turns=3).generate(
        ScriptedEngine(tok, script), [Prompt("p", "q ")], [2], seed=0)
    assert all(len(r.turns) == 3 for r in group.rollouts)
    assert metrics["episode/unknown_tool"] == 4.0  # two episodes × the two turns that were answered
    assert "unknown tool 'nope'" in group.rollouts[0].messages[1]["content"]


def test_the_token_budget_counts_inserted_ids():
    tok = char_tokenizer()
    (group,), _ = sampler(tok, max_new_tokens=40).generate(
        ScriptedEngine(tok, calculator_script), [Prompt("p", "q ")], [1], seed=0)
    (r,) = group.rollouts
    assert len(r.completion_ids) <= 40 and r.finish_reason == "length"


def test_the_environment_reward_is_a_component():
    from rollwise.filter.rewards import score_groups

    tok = char_tokenizer()
    script = lambda text: "<call>guess(7)</call>" if "<result>" not in text else "done"  # noqa: E731
    groups, _ = sampler(tok, env=GuessNumber).generate(
        ScriptedEngine(tok, script), [Prompt("a", "guess ", columns={"secret": 7}),
                                      Prompt("b", "guess ", columns={"secret": 9})], [1, 1], seed=0)
    score_groups(groups, [])
    assert [g.rollouts[0].reward for g in groups] == [1.0, 0.0]
    assert groups[0].rollouts[0].reward_components == {"environment": 1.0}
    assert groups[0].rollouts[0].turns[1].state == "7:correct"
