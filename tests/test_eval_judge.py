"""The user's own data and rewards, end to end (issue 33): the eval judge follows the user's
rewards, failing reward functions reach summary.json and the closing lines, an empty eval split
trains without an eval, a run where no group had a reward spread says so, plain prompts get the
chat template of a chat model."""

import io
import json
import logging
import sys

import pytest
from rich.console import Console

from rollwise.config import ConfigError, validate
from rollwise.filter.registry import resolve_rewards
from rollwise.tasks.files import FileTaskConfig
from rollwise.train.config import RewardConfig, load_run_config

WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "house", "green", "plant", "smile", "bread",
         "chair", "light", "water", "train", "ocean", "sugar", "magic", "storm", "table", "mouse", "candy", "horse",
         "queen", "robot", "snake", "zebra", "pearl", "flame", "glass", "knife", "money", "night", "paper", "radio",
         "sheep", "tower", "vapor", "wheat"]

REWARDS = '''
import math

def always_one(prompts, completions, **kw):
    return [1.0] * len(completions)

def reversed_ok(prompts, completions, target, **kw):
    return [float(t in c) for c, t in zip(completions, target)]

def spread(prompts, completions, **kw):
    return [sum(map(ord, c)) / 1000 for c in completions]

def broken(prompts, completions, **kw):
    raise RuntimeError("boom")

def nan_reward(prompts, completions, **kw):
    return [math.nan] * len(completions)

def plain_strings(prompts, completions, **kw):
    assert all(isinstance(p, str) for p in prompts) and all(isinstance(c, str) for c in completions)
    return [0.0] * len(completions)
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A 40-row 'reverse this word' JSONL and a reward module named for this test, in a directory
    that is the working directory and on sys.path (the import rule itself: tests/test_imports.py)."""
    module = f"user_rewards_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{module}.py").write_text(REWARDS)
    rows = [{"prompt": f"Reverse this word: {w}", "target": w[::-1]} for w in WORDS]
    (tmp_path / "words.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, module
    sys.modules.pop(module, None)


FAST = ["rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=6", "train.steps=2",
        "train.eval_every=0", "train.eval_samples=2", "train.eval_size=4", "optim.micro_batch_size=4",
        "model.threads=1", "task.name=file", "task.answer_field=target"]


def train(user_dir, *sets):
    """Run ``rollwise train`` in process: (summary, what it printed, the run directory)."""
    from rollwise.train.run import run_training

    tmp, module = user_dir
    sets = [s.replace("MOD", module) for s in sets]
    cfg = load_run_config(None, [f"output_dir={tmp / 'runs'}", "task.path=words.jsonl", *FAST, *sets])
    out = io.StringIO()
    summary = run_training(cfg, console=Console(file=out, width=200))
    return summary, out.getvalue(), tmp / "runs" / cfg.name


def file_task(path, **kw):
    return validate(FileTaskConfig, {"name": "file", "path": str(path), "answer_field": "target", **kw}).build(seed=0)


# -- item 1: the eval judge -------------------------------------------------------------------------------------
def test_file_task_judge_is_the_first_of_rewards(user_dir):
    tmp, module = user_dir
    task = file_task(tmp / "words.jsonl")
    fns, judge = resolve_rewards([RewardConfig(name=f"{module}:reversed_ok"),
                                  RewardConfig(name=f"{module}:spread", weight=0.2)], task)
    assert judge.name == "reversed_ok" and judge.fn is fns[0].fn and judge.weight == 1.0
    # task.reward set: it is the judge (and the reward when rewards: is unset), module:function or built-in
    task = file_task(tmp / "words.jsonl", reward=f"{module}:reversed_ok")
    fns, judge = resolve_rewards(None, task)
    assert judge.name == "reversed_ok" and [f.name for f in fns] == ["reversed_ok"]
    fns, judge = resolve_rewards([RewardConfig(name=f"{module}:spread")], task)
    assert judge.name == "reversed_ok" and [f.name for f in fns] == ["spread"]
    # neither: math_answer, as before
    assert resolve_rewards(None, file_task(tmp / "words.jsonl"))[1].name == "math_answer"


def test_task_reward_names_the_field_and_the_choices(user_dir):
    tmp, _ = user_dir
    with pytest.raises(ConfigError, match=r"unknown reward 'exact'.*built-in rewards: .*math_answer.*"
                                          r"or 'package\.module:function'"):
        file_task(tmp / "words.jsonl", reward="exact")
    with pytest.raises(ConfigError, match=r"task\.reward: cannot import module 'no_such_mod_xyz'"):
        file_task(tmp / "words.jsonl", reward="no_such_mod_xyz:fn")
    # no answers, no task.reward, no rewards: nothing to score with, and the error says what to set
    task = validate(FileTaskConfig, {"name": "file", "path": str(tmp / "words.jsonl"), "answer_field": None}).build(0)
    with pytest.raises(ConfigError, match=r"rewards.*task\.reward.*task\.answer_field"):
        resolve_rewards(None, task)
    with pytest.raises(ConfigError, match="task.answer_field"):
        validate(FileTaskConfig, {"name": "file", "path": str(tmp / "words.jsonl"), "answer_field": None,
                                  "reward": "math_answer"}).build(0)


def test_warns_once_when_the_judge_is_not_a_training_reward(user_dir, caplog):
    tmp, module = user_dir
    task = file_task(tmp / "words.jsonl", reward="math_answer")
    with caplog.at_level(logging.WARNING, logger="rollwise"):
        resolve_rewards([RewardConfig(name=f"{module}:always_one")], task)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "math_answer" in warned[0] and "always_one" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rollwise"):
        resolve_rewards([RewardConfig(name=f"{module}:always_one")], file_task(tmp / "words.jsonl"))
        resolve_rewards([RewardConfig(name="math_answer"), RewardConfig(name=f"{module}:always_one")], task)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_user_reward_judges_the_eval(user_dir):
    """Training reward 1.0 every step; eval accuracy, pass@k, maj@k and the closing line say 100%, not
    math_answer's 0% ("no final answer found")."""
    summary, out, run_dir = train(user_dir, "name=judge", "rewards=[{name: MOD:always_one}]")
    assert summary["initial_accuracy"] == 1.0 and summary["final_accuracy"] == 1.0
    assert summary["eval_judge"] == "always_one"
    assert "eval accuracy 100.0% → 100.0%" in out
    evals = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in ln]
    assert evals and all(m["eval/pass@2"] == 1.0 for m in evals)
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert sample["components"] == {"always_one": 1.0} and "math_answer" not in sample["reasons"]


# -- item 3: failing reward functions ---------------------------------------------------------------------------
def test_failing_reward_functions_reach_the_summary(user_dir):
    summary, out, run_dir = train(user_dir, "name=failing",
                                  "rewards=[{name: MOD:reversed_ok}, {name: MOD:broken}, {name: MOD:nan_reward}]")
    failures = summary["reward_failures"]
    assert set(failures) == {"broken", "nan_reward"}  # reversed_ok never failed
    rollouts = 2 * 2 * 2  # steps × prompts × generations
    assert failures["broken"] == {"rollouts": rollouts, "errors": rollouts, "non_finite": 0,
                                  "first_reason": "broken raised RuntimeError: boom"}
    assert failures["nan_reward"]["non_finite"] == rollouts and failures["nan_reward"]["errors"] == 0
    assert failures["nan_reward"]["first_reason"].startswith("non-finite")
    assert f"reward function 'broken' failed on {rollouts} of {rollouts} rollouts" in out
    assert "broken raised RuntimeError: boom" in out and "nan_reward" in out


def test_reward_failures_total_over_a_resumed_run(user_dir):
    """The counts live in the checkpoint's state: a run stopped after step 1 and resumed to step 2
    reports both steps' failures, as the uninterrupted run does."""
    from rollwise.train.run import run_training

    tmp, module = user_dir
    sets = [f"output_dir={tmp / 'runs'}", "name=resumed", "task.path=words.jsonl", *FAST,
            "train.checkpoint_every=1", f"rewards=[{{name: {module}:reversed_ok}}, {{name: {module}:broken}}]"]
    quiet = Console(file=io.StringIO())
    run_training(load_run_config(None, sets + ["train.steps=1"]), console=quiet)
    summary = run_training(load_run_config(None, sets), resume=True, console=quiet)
    assert summary["steps"] == 2 and summary["reward_failures"]["broken"]["errors"] == 2 * 2 * 2


def test_a_clean_run_has_no_reward_failures(user_dir):
    summary, out, _ = train(user_dir, "name=clean", "rewards=[{name: MOD:reversed_ok}]")
    assert summary["reward_failures"] == {} and "failed on" not in out


# -- item 5: an empty eval split --------------------------------------------------------------------------------
@pytest.mark.parametrize("split", [["task.eval_fraction=0"], ["task.path=four.jsonl"]])
def test_no_eval_split_trains_without_eval(user_dir, split):
    tmp, _ = user_dir
    (tmp / "four.jsonl").write_text("".join(json.dumps({"prompt": f"Reverse {w}", "target": w[::-1]}) + "\n"
                                            for w in WORDS[:4]))
    summary, out, run_dir = train(user_dir, "name=noeval", "rewards=[{name: MOD:reversed_ok}]", *split)
    assert summary["steps"] == 2 and summary["initial_accuracy"] is None and summary["final_accuracy"] is None
    assert summary["eval"] == "none: the task has no eval split"
    assert "no eval" in out and "task.eval_fraction" in out
    assert not (run_dir / "evals.jsonl").exists()


def test_rollwise_eval_on_no_eval_split_is_a_config_error(user_dir):
    from rollwise.train.loop import Trainer

    tmp, module = user_dir
    cfg = load_run_config(None, [f"output_dir={tmp / 'runs'}", "task.path=words.jsonl", *FAST,
                                 "task.eval_fraction=0", f"rewards=[{{name: {module}:reversed_ok}}]"])
    with Trainer(cfg) as trainer, pytest.raises(ConfigError, match="no eval prompts.*task.eval_fraction"):
        trainer.evaluate()


# -- item 6: nothing trained ------------------------------------------------------------------------------------
def test_a_run_without_reward_spread_says_nothing_trained(user_dir):
    summary, out, _ = train(user_dir, "name=flat", "rewards=[{name: MOD:always_one}]")
    assert summary["zero_signal_steps"] == 2
    assert "no step had a reward spread" in out and "nothing trained" in out


def test_a_run_with_reward_spread_gives_no_hint(user_dir):
    summary, out, _ = train(user_dir, "name=spread", "rewards=[{name: MOD:spread}]")
    assert summary["zero_signal_steps"] == 0 and "reward spread" not in out


# -- item 4: plain prompts on a chat model ----------------------------------------------------------------------
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}A:"


def test_trainer_applies_and_announces_the_chat_template(user_dir, monkeypatch, caplog):
    """A tokenizer with a chat template: plain prompts go through it (train and eval), the log says
    so at start, and reward functions still get the plain strings (TRL's format for a plain field)."""
    from rollwise.model.tiny import build_tiny
    from rollwise.train import loop

    tmp, module = user_dir
    model, tok = build_tiny("tiny", seed=0)
    tok.chat_template = TEMPLATE
    monkeypatch.setattr(loop, "load_model_and_tokenizer", lambda cfg, seed=0: (model, tok))
    cfg = load_run_config(None, [f"output_dir={tmp / 'runs'}", "name=chat", "task.path=words.jsonl", *FAST,
                                 f"rewards=[{{name: {module}:plain_strings}}]"])
    with caplog.at_level(logging.INFO, logger="rollwise"), loop.Trainer(cfg) as trainer:
        assert tok.decode(trainer.eval_prompts[0].token_ids).startswith("<user>Reverse this word: ")
        trainer.prepare()
        metrics = trainer.step()
    assert metrics["reward/plain_strings/errors"] == 0
    notes = [r.getMessage() for r in caplog.records if "chat template" in r.getMessage()]
    assert len(notes) == 1 and "task.chat_template=auto" in notes[0]
