"""Scoring with TRL-style reward functions: weights, None, async, reasons, failures."""

import sys

import pytest

from rollwise.filter.registry import resolve_rewards
from rollwise.filter.rewards import RewardFn, load_callable, score_groups
from rollwise.tasks import arith
from rollwise.train.config import RewardConfig
from rollwise.types import Prompt, Rollout, RolloutGroup, Score


def group(texts, answer="4"):
    prompt = Prompt(id="p", text="2+2=", answer=answer, columns={"level": 1})
    rollouts = [Rollout("p", [1], [5], [-0.1], [0], "stop", completion_text=t) for t in texts]
    return RolloutGroup(prompt, rollouts)


def length_reward(completions, **_):
    return [len(c) / 10 for c in completions]


def test_weighted_sum_and_per_component_metrics():
    g = group([" #4", " #5"])
    metrics = score_groups([g], [RewardFn("arith", arith.arith_reward, 2.0), RewardFn("len", length_reward, 0.5)])
    # rollout 0: 2*1.0 + 0.5*0.3 = 2.15 ; rollout 1: 2*0 + 0.5*0.3 = 0.15
    assert g.rewards == pytest.approx([2.15, 0.15])
    assert metrics["reward/arith"] == 0.5 and metrics["reward/len"] == pytest.approx(0.3)
    assert g.rollouts[1].reward_reasons["arith"].startswith("wrong answer 5")
    assert g.rollouts[0].reward_components == {"arith": 1.0, "len": pytest.approx(0.3)}


def test_dataset_columns_and_completion_ids_reach_the_function():
    seen = {}

    def spy(prompts, completions, completion_ids, answer, level, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, answer=answer, level=level)
        return [0.0] * len(completions)

    score_groups([group(["a"])], [RewardFn("spy", spy)])
    assert seen == {"prompts": ["2+2="], "ids": [[5]], "answer": ["4"], "level": [1]}


def test_none_means_not_applicable():
    g = group(["x", "y"])
    score_groups([g], [RewardFn("half", lambda completions, **_: [1.0, None])])
    assert g.rewards == [1.0, 0.0]
    assert "half" in g.rollouts[0].reward_components and "half" not in g.rollouts[1].reward_components


def test_async_reward_function():
    async def slow(completions, **_):
        return [Score(0.5, "async")] * len(completions)

    g = group(["x"])
    score_groups([g], [RewardFn("slow", slow)])
    assert g.rewards == [0.5] and g.rollouts[0].reward_reasons["slow"] == "async"


def test_raising_function_scores_zero_with_reason():
    def broken(completions, **_):
        raise RuntimeError("boom")

    g = group(["x", "y"])
    metrics = score_groups([g], [RewardFn("ok", lambda completions, **_: [1.0, 1.0]), RewardFn("broken", broken)])
    assert g.rewards == [1.0, 1.0]
    assert "boom" in g.rollouts[0].reward_reasons["broken"]
    assert metrics["reward/broken/errors"] == 2


def test_wrong_length_and_nan_are_contained():
    g = group(["x", "y"])
    score_groups([g], [RewardFn("short", lambda completions, **_: [1.0])])
    assert g.rewards == [0.0, 0.0] and "returned 1 values" in g.rollouts[0].reward_reasons["short"]
    score_groups([g], [RewardFn("nan", lambda completions, **_: [float("nan"), 1.0])])
    assert g.rewards == [0.0, 1.0] and g.rollouts[0].reward_reasons["nan"].startswith("non-finite")


def test_user_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text("def shout(completions, **kw):\n    return [float('!' in c) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = arith.build(eval_size=4)
    fns, judge = resolve_rewards([RewardConfig(name="my_rewards:shout", weight=0.5)], task)
    assert [f.name for f in fns] == ["shout"] and fns[0].weight == 0.5 and judge.name == "arith"
    g = group(["hi!", "hi"])
    score_groups([g], fns)
    assert g.rewards == [0.5, 0.0]
    sys.modules.pop("my_rewards", None)


def test_unknown_reward_names_the_field():
    task = arith.build(eval_size=4)
    with pytest.raises(ValueError, match=r"rewards\[0\].name 'nope'"):
        resolve_rewards([RewardConfig(name="nope")], task)
    with pytest.raises(ValueError, match="cannot import module"):
        load_callable("no_such_module_xyz:fn")


def test_conversational_prompts_use_trl_message_format():
    prompt = Prompt(id="p", text="2+2=", answer="4", messages=[{"role": "user", "content": "2+2="}])
    g = RolloutGroup(prompt, [Rollout("p", [1], [5], [-0.1], [0], "stop", completion_text="\\boxed{4}")])
    seen = {}

    def trl_style(prompts, completions, **kw):  # as TRL's accuracy_reward reads them
        seen["prompt"] = prompts[0]
        return [float(c[0]["content"] == "\\boxed{4}") for c in completions]

    from rollwise.filter.math_answer import math_answer

    score_groups([g], [RewardFn("trl", trl_style), RewardFn("math", math_answer)])
    assert seen["prompt"] == [{"role": "user", "content": "2+2="}]
    assert g.rollouts[0].reward_components == {"trl": 1.0, "math": 1.0}


def test_chat_template_applied_to_conversational_prompts():
    from rollwise.model.load import encode_prompt
    from rollwise.model.tiny import char_tokenizer

    tok = char_tokenizer()
    plain = Prompt(id="a", text="hi")
    chat = Prompt(id="b", text="hi", messages=[{"role": "user", "content": "hi"}])
    assert encode_prompt(tok, chat) == encode_prompt(tok, plain)  # no template: plain text
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}A:"
    assert tok.decode(encode_prompt(tok, chat)) == "<user>hiA:"
