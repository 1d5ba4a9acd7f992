"""``task.name: reasoning_gym``: rows, seeds, held-out eval, the verifier's reasons, weights, errors, a smoke run."""

import sys
from collections import Counter

import pytest

from rollwise.config import ConfigError
from rollwise.filter.reasoning_gym import extract, make_reward, reasoning_gym_reward, score_one
from rollwise.filter.rewards import RewardFn, score_groups
from rollwise.tasks.reasoning_gym import EVAL_SPAN, ReasoningGymConfig, build
from rollwise.train.config import load_run_config
from rollwise.types import Rollout, RolloutGroup, is_correct

pytest.importorskip("reasoning_gym")

COUNT_1_OF_4 = 98  # chain_sum prompts among the first 400 at weights 1:3, seed 0 (counted once, fixed by the seeds)
MIX = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, "max_digits": 2}},
       {"name": "leg_counting", "weight": 0.5}]


def task_for(seed=0, eval_size=20, datasets=MIX, **kw):
    return build(ReasoningGymConfig(datasets=datasets, eval_size=eval_size, **kw), seed)


def columns(prompts):
    rows = [p.reward_columns() for p in prompts]
    return {k: [r.get(k) for r in rows] for k in sorted({k for r in rows for k in r})}


def score(task, prompts, completions):
    return task.rewards["reasoning_gym"](prompts=[p.messages for p in prompts], completions=completions,
                                         **columns(prompts))


def test_rows_are_conversational_with_answer_and_columns():
    task = task_for()
    p = task.train.get(0)
    system, user = p.messages
    assert system["role"] == "system" and "<answer>" in system["content"]  # reasoning-gym's default prompt
    assert user["role"] == "user" and user["content"].startswith(p.text)
    assert user["content"].endswith("Give your final answer between <answer> and </answer> tags.")
    assert p.columns["dataset"] in ("chain_sum", "leg_counting") and p.columns["question"] == p.text
    assert p.answer == p.columns["answer"] and p.columns["metadata"]["source_dataset"] == p.columns["dataset"]
    assert p.id == "train-0" and task.eval[0].id == "eval-0" and len(task.eval) == 20
    assert task.demonstrate(p) == f"<answer>{p.answer}</answer>"


def test_boxed_format_and_system_prompt_override():
    task = task_for(answer_format="boxed")
    (user,) = task.train.get(3).messages  # no system prompt by default for \boxed
    assert user["content"].endswith("put your final answer within \\boxed{}.")
    assert task.demonstrate(task.train.get(3)) == f"\\boxed{{{task.train.get(3).answer}}}"
    task = task_for(system_prompt="Be brief.")
    assert task.train.get(0).messages[0] == {"role": "system", "content": "Be brief."}
    assert len(task_for(system_prompt="").train.get(0).messages) == 1


def test_same_seed_same_prompts_other_seed_other_prompts():
    a, b, c = task_for(seed=3), task_for(seed=3), task_for(seed=4)
    assert [a.train.get(i).messages for i in range(30)] == [b.train.get(i).messages for i in range(30)]
    assert [p.text for p in a.eval] == [p.text for p in b.eval]
    assert [a.train.get(i).text for i in range(30)] != [c.train.get(i).text for i in range(30)]
    # random access: prompt i does not depend on which prompts were drawn before
    assert a.train.get(500).text == task_for(seed=3).train.get(500).text


def test_eval_is_held_out_by_seed_and_by_content():
    # a small problem space (1-digit, 2-term sums: 200 questions) so eval and train would collide
    small = [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}]
    task = task_for(datasets=small, eval_size=60)
    held = {p.text for p in task.eval}
    assert len(held) == 60  # distinct
    train = [task.train.get(i) for i in range(400)]
    assert not held & {p.text for p in train}
    # the generators' seeds are disjoint too: item i of a dataset is seeded base + i, and eval stays below EVAL_SPAN
    gen = task.train.gens[0]
    raw = {gen.item(EVAL_SPAN + i)["question"] for i in range(400)}
    assert raw & held  # the raw train stream does hit eval questions here...
    assert len({p.text for p in train} | held) > 150  # ...and dropping them still leaves the rest of the space


def test_weights_mix_datasets_deterministically():
    mix = [{"name": "chain_sum"}, {"name": "leg_counting", "weight": 3}]
    counts = Counter(task_for(datasets=mix, eval_size=0).train.get(i).columns["dataset"] for i in range(400))
    again = Counter(task_for(datasets=mix, eval_size=0).train.get(i).columns["dataset"] for i in range(400))
    assert counts == again == Counter({"chain_sum": COUNT_1_OF_4, "leg_counting": 400 - COUNT_1_OF_4})
    assert 70 <= COUNT_1_OF_4 <= 130  # a quarter of 400 expected


def test_verifier_reasons_right_wrong_missing_garbage():
    task = task_for()
    p = next(task.train.get(i) for i in range(50) if task.train.get(i).columns["dataset"] == "chain_sum")
    wrong = str(int(p.answer) + 1)
    completions = [f"<think>easy</think> <answer>{p.answer}</answer>", f"<answer>{wrong}</answer>",
                   p.answer, "<answer>", "\x00" * 5000, f"<answer>{'9' * 3000}</answer>", "<answer> </answer>"]
    got = score(task, [p] * len(completions), completions)
    assert [float(s) for s in got] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert got[0].reason == "" and got[0].answer == p.answer
    assert got[1].reason == f"wrong answer {wrong} (expected {p.answer})" and got[1].answer == wrong
    assert got[2].reason == got[3].reason == got[4].reason == "no <answer>...</answer> tag"
    assert got[2].answer is None
    assert got[5].reason == "answer longer than 2000 characters"
    assert got[6].reason == "empty answer" and got[6].answer is None
    # conversational completions (TRL's format) are read as text
    assert score(task, [p], [[{"role": "assistant", "content": f"<answer>{p.answer}</answer>"}]]) == [1.0]


def test_partial_credit_passes_through():
    task = task_for()
    p = next(task.train.get(i) for i in range(50) if task.train.get(i).columns["dataset"] == "chain_sum")
    padded = f"= {p.answer}"  # chain_sum pays len(expected)/len(answer) when the answer contains it
    (s,) = score(task, [p], [f"<answer>{padded}</answer>"])
    assert float(s) == pytest.approx(len(p.answer) / len(padded)) and 0 < s < 1
    assert s.reason == f"partial credit {float(s):.3g} for {padded} (expected {p.answer})"
    assert is_correct(s) == (s > 0.5)  # "correct" stays rollwise's one definition


def test_a_scorer_that_raises_or_an_unknown_dataset_scores_zero():
    def boom(answer, entry):
        raise KeyError("metadata")

    s = score_one("<answer>1</answer>", {"question": "q", "answer": "1", "metadata": {}}, boom)
    assert s == 0.0 and s.reason == "could not score the answer (KeyError: 'metadata')"
    out = reasoning_gym_reward(prompts=["q"], completions=["<answer>1</answer>"], dataset=["no_such"],
                               question=["q"], metadata=[{}], answer=["1"])
    assert out == [0.0] and out[0].reason == "unknown reasoning-gym dataset 'no_such'"
    # unbound, a known dataset uses its default-config scorer
    out = reasoning_gym_reward(prompts=["q"], completions=["<answer>7</answer>"], dataset=["chain_sum"],
                               question=["1 + 6 ="], metadata=[{}], answer=["7"])
    assert out == [1.0]


def test_extract():
    assert extract("<answer>1</answer> then <answer> 2 </answer>") == "2"  # the last tag, stripped
    assert extract("<answer>a\nb</answer>") == "a\nb"
    assert extract("\\boxed{\\frac{1}{2}} and \\boxed{3}", "boxed") == "3"
    assert extract("<answer>3</answer>", "boxed") is None and extract("\\boxed{3", "boxed") is None


def test_boxed_verifier_and_scoring_stage_carries_answer():
    task = task_for(answer_format="boxed")
    p = task.train.get(1)
    rollouts = [Rollout(p.id, [1], [5], [-0.1], [0], "stop", completion_text=t)
                for t in (f"so \\boxed{{{p.answer}}}", f"<answer>{p.answer}</answer>")]
    group = RolloutGroup(p, rollouts)
    score_groups([group], [RewardFn("reasoning_gym", task.rewards["reasoning_gym"])])
    assert [r.score for r in rollouts] == [1.0, 0.0]
    assert rollouts[0].extracted_answer == " ".join(p.answer.split()) and rollouts[1].extracted_answer is None
    assert rollouts[1].reward_reasons == {"reasoning_gym": "no \\boxed{...} answer"}


def test_demonstrations_score_one():
    for fmt in ("answer_tag", "boxed"):
        task = task_for(answer_format=fmt, datasets=MIX + [{"name": "gsm_symbolic"}, {"name": "basic_arithmetic"}])
        prompts = [task.train.get(i) for i in range(40)]
        assert all(s == 1.0 for s in score(task, prompts, [task.demonstrate(p) for p in prompts]))


def _config_error(*sets):
    with pytest.raises(ConfigError) as err:
        cfg = load_run_config(None, ["task.name=reasoning_gym", "task.eval_size=4", *sets])
        cfg.task.build(cfg.seed)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_config_errors_name_the_field_and_the_fix():
    msg = _config_error("task.datasets=[{name: chain_summ}]")
    assert msg.startswith("task.datasets[0].name 'chain_summ' is not a reasoning-gym dataset; did you mean 'chain_sum'")
    msg = _config_error("task.datasets=[{name: chain_sum}, {name: leg_counting, config: {min_animal: 2}}]")
    assert "task.datasets[1].config: 'min_animal' is not a leg_counting option; did you mean 'min_animals'?" in msg
    msg = _config_error("task.datasets=[{name: chain_sum, config: {min_terms: 5, max_terms: 2}}]")
    assert msg.startswith("task.datasets[0].config: chain_sum rejects") and "max_terms must be >= min_terms" in msg
    assert "task.datasets[0].config.seed: rollwise sets it" in _config_error("task.datasets=[{name: chain_sum, config: {seed: 1}}]")
    assert "'task.datasets': Value error, no datasets" in _config_error("task.datasets=[]")
    assert "'task.datasets.0.weight'" in _config_error("task.datasets=[{name: chain_sum, weight: 0}]")
    assert "'chain_sum' is listed twice" in _config_error("task.datasets=[{name: chain_sum}, {name: chain_sum}]")
    assert "task.answer_format" in _config_error("task.answer_format=latex")


def test_missing_extra_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rollwise\[reasoning\]'"):
        task_for()


def test_two_training_steps_on_the_tiny_model(tmp_path):
    from rollwise.train.loop import Trainer

    sets = [f"output_dir={tmp_path}", "name=rg", "task.name=reasoning_gym", "task.eval_size=4",
            "task.datasets=[{name: chain_sum, config: {max_terms: 2, max_digits: 1}}]",
            "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=8",
            "train.steps=2", "train.eval_size=2", "train.eval_samples=2", "train.eval_every=0",
            "train.checkpoint_every=0", "sft.steps=2", "model.threads=1"]
    with Trainer(load_run_config(None, sets)) as trainer:
        trainer.prepare()
        for _ in range(2):
            m = trainer.step()
        assert trainer.state.step == 2 and m["tokens/generated"] > 0 and "reward/reasoning_gym" in m
        metrics = trainer.evaluate().metrics()
        assert {"eval/accuracy", "eval/pass@2", "eval/maj@2"} <= set(metrics)


def test_the_docs_example_recipe_builds():
    import re
    from pathlib import Path

    import yaml

    from rollwise.config import validate
    from rollwise.train.config import RunConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    recipe = next(b for b in blocks if b.get("task", {}).get("name") == "reasoning_gym")
    task = validate(RunConfig, recipe).task.build(0)
    assert len(task.eval) == 200 and {p.columns["dataset"] for p in task.eval} == {"chain_sum", "leg_counting",
                                                                                   "gsm_symbolic"}


def test_lenient_format_reads_prose_answers():
    # SmolLM2-135M answers "6 + 6 = 12." or "The answer is 12. Here's why: 1. ..." and never boxes
    assert extract("6 + 6 = 12.", "lenient") == "12"
    assert extract("The answer is 12. Here's the reasoning: 1. The problem", "lenient") == "12"
    assert extract("so \\boxed{-4} since 3 - 7 = -4 and 1", "lenient") == "-4"  # a box wins
    assert extract("1,234 apples", "lenient") == "1234" and extract("no digits here", "lenient") is None
    task = task_for(answer_format="lenient", datasets=MIX[:1])
    p = task.train.get(3)
    wrong = str(int(p.answer) + 1)
    scores = score(task, [p, p, p], [f"It is {p.answer}.", f"The answer is {wrong}.", "I cannot say."])
    assert [float(s) for s in scores] == [1.0, 0.0, 0.0]
    assert "\\boxed{}" in p.messages[-1]["content"] and task.demonstrate(p) == f"\\boxed{{{p.answer}}}"
