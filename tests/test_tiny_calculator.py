"""arith with a calculator (issue 24, recipes/tiny_calculator.yaml): products answered directly or
through calculator episodes; the demonstrations are episodes the plain format reads, the SFT
warm start trains exactly the ids an episode trains, and the verifier scores episode text."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from rollwise.engine.engine import Completion
from rollwise.engine.sampling import SamplingParams
from rollwise.filter.arith import arith_reward
from rollwise.generate.episode import EpisodeSampler
from rollwise.model.tiny import char_tokenizer
from rollwise.tasks import arith
from rollwise.tasks.arith import ArithConfig, build
from rollwise.tasks.environment import EpisodeEnv
from rollwise.tasks.envs import Calculator
from rollwise.tasks.tool_calls import FORMATS
from rollwise.train.config import load_run_config
from rollwise.train.sft import demo_batch, demo_ids

PLAIN = FORMATS["plain"]
RECIPES = Path(__file__).parent.parent / "recipes"


def tool_task(**kw):
    return build(seed=0, eval_size=8, min_digits=2, max_digits=3, ops="*", tool_demos=True, **kw)


def test_doctests():
    assert doctest.testmod(arith).failed == 0


def test_products_answer_directly_without_tool_demos():
    task = build(seed=0, eval_size=8, min_digits=2, max_digits=3, ops="*")
    p = task.train.get(0)
    a, b = p.columns["a"], p.columns["b"]
    assert p.text == f"{a}*{b}=" and p.answer == str(a * b)
    assert task.demonstrate(p) == f" #{a * b}"
    assert arith_reward([p.text], [task.demonstrate(p)], answer=[p.answer]) == [1.0]
    with pytest.raises(ValueError, match="'\\+', '-' and '\\*'"):
        ArithConfig(ops="*/")


def test_tool_demonstrations_call_the_calculator_and_answer_its_result():
    task = tool_task()
    for p in map(task.train.get, range(20)):
        call, result_message, answer = task.demonstrate(p).written(PLAIN)  # a conversation (tasks/tool_demos.py)
        call, answer = call["content"], answer["content"]
        (tool_call,) = PLAIN.parse(call)  # the plain format reads the call the model is taught
        assert tool_call.name == "calculate" and tool_call.error is None
        result = Calculator().calculate(*tool_call.positional)
        inserted = PLAIN.result_text([result_message["content"]])
        assert result == p.answer and inserted == PLAIN.result_text([result])
        episode_text = call + inserted + answer  # what reward functions get: results included
        assert arith_reward([p.text], [episode_text], answer=[p.answer]) == [1.0]
        assert arith_reward([p.text], [call + inserted + " #1"], answer=[p.answer])[0] == 0.0


class Replay:
    """An engine whose "model" writes the demonstration's next model segment, then EOS."""

    def __init__(self, tok, turns):
        self.tok, self.turns, self.queue = tok, turns, {}

    def submit(self, requests):
        handles = []
        for r in requests:
            text = self.tok.decode(r.prompt_ids, skip_special_tokens=True)
            ids = self.tok(self.turns[text.count("<result>")], add_special_tokens=False)["input_ids"]
            ids = ids + [self.tok.eos_token_id]
            h = len(self.queue) + 1
            self.queue[h] = Completion(h, list(r.prompt_ids), ids, [-0.1] * len(ids), [0] * len(ids), "stop")
            handles.append(h)
        return handles

    def run_until(self, condition=None):
        done, self.queue = self.queue, {}
        return done


def test_sft_trains_exactly_the_ids_an_episode_trains():
    """The demonstration, tokenized for SFT, is the episode a model writing it produces: the same
    ids, and the SFT loss mask is the episode's loss weights (the inserted result untrained)."""
    tok, task = char_tokenizer(), tool_task()
    p = task.eval[0]
    demo = task.demonstrate(p)
    params = SamplingParams(temperature=1.0, max_new_tokens=80, stop_token_ids=(tok.eos_token_id,))
    episodes = EpisodeSampler(params, tok, lambda: EpisodeEnv(Calculator(), 5.0, 2000), PLAIN, max_turns=2)
    turns = [m["content"] for m in demo.written(PLAIN) if m["role"] == "assistant"]
    (group,), metrics = episodes.generate(Replay(tok, turns), [p], [1], seed=0)
    (r,) = group.rollouts
    ids, mask = demo_ids(tok, demo)
    assert r.completion_ids == ids and r.loss_weights == mask and metrics["episode/tool_calls"] == 1.0
    assert tok.decode([i for i, m in zip(ids, mask) if not m]) == f"<result>{p.answer}</result>"
    assert arith_reward([p.text], [r.completion_text], answer=[p.answer]) == [1.0]
    assert demo_ids(tok, " #12") == (tok(" #12", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], [1] * 5)
    # the SFT batch trains those positions: the loss mask (shifted to the predicted id) is the demo's mask
    ids, _, loss_mask = demo_batch(tok, task, 0, 2, "cpu")
    for k, (row, m) in enumerate(zip(ids, loss_mask)):
        trained = [t for t, w in zip(row[1:].tolist(), m.tolist()) if w]
        assert trained == [i for i, w in zip(*demo_ids(tok, task.demonstrate(task.train.get(k)))) if w]


def test_the_two_recipes_differ_only_in_the_tool():
    tool = load_run_config(str(RECIPES / "tiny_calculator.yaml")).model_dump()
    plain = load_run_config(str(RECIPES / "tiny_calculator_no_tool.yaml")).model_dump()
    assert tool["rollout"].pop("environment") == "calculator" and plain["rollout"].pop("environment") is None
    assert tool["task"].pop("tool_demos") and not plain["task"].pop("tool_demos")
    for cfg in (tool, plain):
        cfg.pop("name"), cfg["rollout"].pop("tool_format"), cfg["rollout"].pop("max_turns")
    assert tool == plain
