"""The file task: JSONL/Parquet loading, field mapping, splits, and errors naming file and line."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollwise.config import ConfigError, validate
from rollwise.tasks.files import FileTaskConfig

ROWS = [
    {"question": f"What is {i}+{i}?", "answer": str(2 * i), "level": i % 3, "solution": f" #### {2 * i}"}
    for i in range(50)
]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def config(path, **kw):
    return validate(FileTaskConfig, {"name": "file", "path": str(path), "prompt_field": "question", **kw})


def all_train(task, n):
    return [task.train.get(i) for i in range(n)]


def test_jsonl_mapping_and_extra_columns(tmp_path):
    task = config(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_fraction=0.0).build(seed=0)
    prompts = sorted(all_train(task, 50), key=lambda p: int(p.id.split("-")[1]))
    first = prompts[0]
    assert (first.id, first.text, first.answer) == ("row-0", "What is 0+0?", "0")
    assert first.columns == {"answer": "0", "level": 0, "solution": " #### 0"}
    assert first.reward_columns()["level"] == 0
    assert task.demonstrate is None and task.eval == []
    assert list(task.rewards) == ["math_answer"]


def test_rewards_and_demonstrations(tmp_path):
    task = config(write_jsonl(tmp_path / "d.jsonl", ROWS), demo_field="solution").build(seed=0)
    prompts = all_train(task, 20)
    reward = task.rewards["math_answer"]
    cols = [p.reward_columns() for p in prompts]
    demos = [task.demonstrate(p) for p in prompts]
    scores = reward([p.text for p in prompts], demos, answer=[c["answer"] for c in cols])
    assert scores == [1.0] * 20


def test_eval_split_is_disjoint_deterministic_and_capped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS + ROWS[:5])  # duplicated prompt texts
    task = config(path, eval_fraction=0.2).build(seed=1)
    eval_texts = {p.text for p in task.eval}
    train_texts = {p.text for p in all_train(task, 200)}
    assert len(task.eval) == 11 and not eval_texts & train_texts
    assert eval_texts | train_texts == {r["question"] for r in ROWS}
    again = config(path, eval_fraction=0.2).build(seed=1)
    assert [p.id for p in again.eval] == [p.id for p in task.eval]
    assert [p.id for p in all_train(again, 30)] == [p.id for p in all_train(task, 30)]
    assert len(config(path, eval_fraction=0.2, eval_size=4).build(seed=1).eval) == 4


def test_separate_eval_file(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS[:40])
    evals = write_jsonl(tmp_path / "eval.jsonl", ROWS[35:])
    task = config(train, eval_path=str(evals), eval_size=10).build(seed=0)
    assert len(task.eval) == 10 and all(p.id.startswith("eval-row-") for p in task.eval)
    assert {p.text for p in all_train(task, 40)} == {r["question"] for r in ROWS[:35]}  # overlap dropped


def test_parquet_round_trip(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    from_parquet = config(path, eval_fraction=0.1).build(seed=2)
    from_jsonl = config(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_fraction=0.1).build(seed=2)
    assert [(p.id, p.text, p.answer, p.columns) for p in from_parquet.eval] == [
        (p.id, p.text, p.answer, p.columns) for p in from_jsonl.eval
    ]


def test_chat_prompts(tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": messages, "answer": "4"}])
    task = validate(FileTaskConfig, {"path": str(path), "eval_fraction": 0.0}).build(seed=0)
    prompt = task.train.get(0)
    assert prompt.text == "Be brief.\n\nWhat is 2+2?"
    assert prompt.messages == messages and "prompt_messages" not in prompt.columns


def error(tmp_path, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        config(tmp_path / "d.jsonl", **kw).build(seed=0)
    return str(info.value)


def test_missing_file(tmp_path):
    msg = error(tmp_path)
    assert "task.path" in msg and str(tmp_path / "d.jsonl") in msg and "does not exist" in msg


def test_invalid_json_names_file_and_line(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", ROWS[:3], extra_lines=['{"question": "oops"'])
    msg = error(tmp_path)
    assert msg.startswith(f"file {tmp_path / 'd.jsonl'} line 4: invalid JSON (")


def test_non_object_line(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", ROWS[:2], extra_lines=["[1, 2]"])
    assert "line 3: expected a JSON object, got list" in error(tmp_path)


def test_missing_field_names_line_key_and_fields(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", ROWS[:2] + [{"q": "hi", "answer": "1"}])
    msg = error(tmp_path)
    assert msg == (
        f"file {tmp_path / 'd.jsonl'} line 3: row has no field 'question' (task.prompt_field); "
        "fields present: 'q', 'answer'"
    )
    write_jsonl(tmp_path / "d.jsonl", [{"question": "hi"}])
    assert "(task.answer_field)" in error(tmp_path)
    write_jsonl(tmp_path / "d.jsonl", [{"question": "hi", "answer": "1"}])
    assert "(task.demo_field)" in error(tmp_path, demo_field="solution")


def test_bad_prompt_type(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"question": 7, "answer": "1"}])
    assert "line 1: field 'question' (task.prompt_field) must be a string" in error(tmp_path)


def test_empty_and_unsupported(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n\n")
    assert "has no rows" in error(tmp_path)
    (tmp_path / "d.csv").write_text("question,answer\n")
    with pytest.raises(ConfigError, match=r"task.path: .*unsupported extension '.csv'"):
        config(tmp_path / "d.csv").build(seed=0)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match="cannot read as Parquet"):
        config(tmp_path / "bad.parquet").build(seed=0)


def test_eval_path_errors_name_their_key(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert "task.eval_path" in error(tmp_path, eval_path=str(tmp_path / "missing.jsonl"))


def test_config_validation(tmp_path):
    with pytest.raises(ConfigError, match="unknown reward 'exact'"):
        config(tmp_path / "d.jsonl", reward="exact")
    with pytest.raises(ConfigError, match="prompt_field"):
        config(tmp_path / "d.jsonl", promt_field="q")
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    # math_answer named without answers; unset task.reward without answers is refused when the rewards
    # are resolved, unless rewards: lists some (tests/test_eval_judge.py)
    assert "task.answer_field" in error(tmp_path, answer_field=None, reward="math_answer")


def test_the_answer_field_reaches_reward_functions_by_its_own_name(tmp_path):
    task = config(write_jsonl(tmp_path / "d.jsonl", ROWS), answer_field="solution", eval_fraction=0.0).build(seed=0)
    prompt = next(p for p in all_train(task, 50) if p.id == "row-3")
    assert prompt.answer == " #### 6" and prompt.reward_columns()["solution"] == " #### 6"
    assert prompt.reward_columns()["answer"] == " #### 6"  # and as `answer`, TRL-style


CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}A:"


def test_plain_prompts_get_the_chat_template_of_a_chat_model(tmp_path):
    """task.chat_template: auto (default) and true wrap a plain prompt as one user message through
    the tokenizer's chat template; false, or a tokenizer without one (the tiny presets), keep the text."""
    from rollwise.model.load import encode_prompt
    from rollwise.model.tiny import char_tokenizer

    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    plain_tok, chat_tok = char_tokenizer(), char_tokenizer()
    chat_tok.chat_template = CHAT_TEMPLATE
    for setting, templated in (("auto", True), (True, True), (False, False)):
        task = config(path, chat_template=setting).build(seed=0)
        prompt = task.train.get(0)
        assert prompt.messages is None  # reward functions still get the plain string
        ids = encode_prompt(chat_tok, prompt)
        assert (chat_tok.decode(ids) == f"<user>{prompt.text}A:") is templated
        if not templated:
            assert ids == chat_tok(prompt.text)["input_ids"]
        assert encode_prompt(plain_tok, prompt) == plain_tok(prompt.text)["input_ids"]
        note = task.check_tokenizer(chat_tok)  # what the run logs at start
        assert note.startswith(f"task.chat_template={str(setting).lower()}: plain prompts")
        assert ("through the model's chat template" in note) is templated
    assert config(path).build(seed=0).check_tokenizer(plain_tok) is None  # auto, no template: nothing to say
    with pytest.raises(ConfigError, match="task.chat_template=true.*no chat template"):
        config(path, chat_template=True).build(seed=0).check_tokenizer(plain_tok)
    with pytest.raises(ConfigError, match="chat_template"):
        config(path, chat_template="yes")
