"""Trainer tiers 2 and 3: smoke runs of the loop and CLI, exact resume, and learning."""

import json

import pytest
import torch
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

FAST = [
    "task.max_digits=2", "task.eval_size=8", "rollout.prompts_per_step=4", "rollout.num_generations=4",
    "rollout.max_new_tokens=32", "train.eval_samples=2", "optim.micro_batch_size=8", "model.threads=1",
]


def fast_config(tmp_path, *extra):
    return load_run_config(None, [f"output_dir={tmp_path}", *FAST, *extra])


def run_steps(trainer: Trainer, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        m = trainer.step()
        trainer.log.log(trainer.state.step, m)
        out.append(m)
    return out


@pytest.mark.parametrize(
    "extra",
    [
        ["objective.method=dr_grpo"],
        ["objective.method=ppo_clip", "objective.epsilon_high=0.28", "objective.mask_truncated_completions=true"],
        ["objective.beta=0.04", "optim.num_iterations=2", "optim.micro_batch_size=5"],
    ],
)
def test_objectives_and_kl_smoke(tmp_path, extra):
    trainer = Trainer(fast_config(tmp_path, "name=obj", "sft.steps=5", *extra))
    trainer.prepare()
    for m in run_steps(trainer, 2):
        assert all(v == v for v in m.values())  # no NaN
    if "objective.beta=0.04" in extra:
        assert trainer.ref_model is not None and "kl" in m


def test_countdown_and_file_tasks_train(tmp_path):
    rows = "".join(f'{{"question": "What is {i}+{i}?", "answer": "{2 * i}", "level": {i % 3}}}\n' for i in range(20))
    (tmp_path / "data.jsonl").write_text(rows)
    common = ["rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=16",
              "train.eval_size=4", "train.eval_samples=0", "model.threads=1"]
    for task in (["task.name=countdown", "task.eval_size=4", "sft.steps=3"],
                 ["task.name=file", f"task.path={tmp_path / 'data.jsonl'}", "task.prompt_field=question"]):
        name = task[0].removeprefix("task.name=")  # one run directory each: a second run never replaces the first
        trainer = Trainer(load_run_config(None, [f"output_dir={tmp_path}", f"name={name}", *task, *common]))
        trainer.prepare()
        m = run_steps(trainer, 1)[0]
        errors = {k: v for k, v in m.items() if k.startswith("reward/") and k.endswith("/errors")}
        # the task's verifier scored every completion (a reward function that raises scores 0 silently)
        assert m["tokens/generated"] > 0 and errors and all(v == 0 for v in errors.values()), errors


def test_resume_without_checkpoint_is_an_error(tmp_path):
    trainer = Trainer(fast_config(tmp_path, "name=none"))
    with pytest.raises(ConfigError, match="no checkpoint"):
        trainer.prepare(resume=True)


def test_cli_train_writes_run_directory(tmp_path):
    args = ["train", "--set", f"output_dir={tmp_path}", "--set", "name=smoke", "--set", "sft.steps=5",
            "--set", "train.steps=2", "--set", "train.eval_every=1", "--set", "train.checkpoint_every=1"]
    for item in FAST:
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = tmp_path / "smoke"
    summary = json.loads((run / "summary.json").read_text())
    for key in ("initial_accuracy", "final_accuracy", "steps", "wall_seconds", "cpu_seconds", "generated_tokens",
                "seed"):
        assert key in summary
    assert summary["steps"] == 2 and summary["generated_tokens"] > 0
    state = json.loads((run / "checkpoints" / "step_000002" / "state.json").read_text())
    assert 0 < state["cpu_seconds"] <= summary["cpu_seconds"]  # SFT, evals and RL counted; the summary last
    assert (run / "config.yaml").exists() and (run / "samples.jsonl").read_text()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert "learned" in result.output
    # --resume of a finished run does no more steps and keeps the summary
    result = CliRunner().invoke(app, args + ["--resume"])
    assert result.exit_code == 0, result.output
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["steps"] == 2 and resumed["cpu_seconds"] > state["cpu_seconds"]  # the new session's load added
    # a fresh run into the same directory is refused (the run is kept); --overwrite starts over, and no stale
    # checkpoint survives to be resumed
    result = CliRunner().invoke(app, args + ["--set", "train.steps=1"])
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    result = CliRunner().invoke(app, args + ["--set", "train.steps=1", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_000001"]


def test_cli_sft_then_eval_the_saved_model(tmp_path):
    out = tmp_path / "warm"
    sets = sum((["--set", s] for s in FAST), [])
    result = CliRunner().invoke(app, ["sft", "--out", str(out), "--set", "sft.steps=3", *sets])
    assert result.exit_code == 0, result.output
    assert (out / "config.json").exists()
    result = CliRunner().invoke(app, ["eval", "--json", str(tmp_path / "e.json"), "--set", f"model.path={out}", *sets])
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "e.json").read_text())
    # the CLI's numbers are the trainer's own evaluation of that model directory, recomputed here
    cfg = load_run_config(None, [f"output_dir={tmp_path}", f"model.path={out}", *FAST])
    expected = Trainer(cfg).evaluate().metrics()
    scores = {k: v for k, v in metrics.items() if k.startswith("eval/")}  # beside them: the engine's precision
    assert scores == pytest.approx(expected) and "eval/pass@2" in scores and "eval/maj@2" in scores
    assert metrics["engine_dtype"] == "float32" and metrics["engine_dtype_reason"]


def test_cli_list():
    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("arith", "countdown", "math_answer", "grpo", "dr_grpo", "ppo_clip", "group"):
        assert name in result.output


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--set", "optim.lrr=1"], "did you mean 'optim.lr'"),
        (["--set", "model.path=/nonexistent/model"], "does not exist"),
        (["/nonexistent/recipe.yaml"], "does not exist"),
    ],
)
def test_cli_bad_input_is_one_line(args, expected):
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 2
    assert expected in result.output and "Traceback" not in result.output


def test_model_dir_without_config(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--set", f"model.path={tmp_path}"])
    assert result.exit_code == 2 and "no config.json" in result.output


def test_thirty_rl_steps_raise_mean_reward(tmp_path):
    """Behaviour: after a short SFT warm start, 30 GRPO steps raise the policy's mean reward.

    Measured on a fixed probe (the eval split, 8 samples per prompt: the unbiased pass@1 is
    the mean sampled reward), so the comparison does not ride on which prompts a step drew.
    """
    cfg = load_run_config(None, [
        f"output_dir={tmp_path}", "name=learn", "task.max_digits=2", "task.eval_size=64", "sft.steps=400",
        "sft.batch_size=32", "rollout.prompts_per_step=16", "rollout.num_generations=8", "rollout.max_new_tokens=40",
        "optim.lr=1e-4", "optim.micro_batch_size=128", "train.eval_samples=8", "model.threads=1",
    ])
    trainer = Trainer(cfg)
    trainer.prepare()
    before = trainer.evaluate().pass_at[1]
    rewards = [m["reward/mean"] for m in run_steps(trainer, 30)]
    after = trainer.evaluate().pass_at[1]
    # measured on this machine with 2 threads: probe pass@1 0.387 -> 0.484 (seed 0); one thread (used here so a
    # busy neighbour cannot slow it by oversubscription) sums in another order, so its numbers differ slightly
    assert after > before + 0.05, (before, after, rewards)
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10, rewards


def test_local_qwen2_model_directory_trains(tmp_path):
    """A user's local HF model directory (a Qwen2 architecture here) goes through the whole loop."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rollwise.model.tiny import char_tokenizer

    tok = char_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model_dir = tmp_path / "qwen2"
    Qwen2ForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    trainer = Trainer(fast_config(tmp_path, f"model.path={model_dir}", "sft.steps=2"))
    trainer.prepare()
    assert type(trainer.engine).__name__ == "SlotEngine"
    before = [p.detach().clone() for p in trainer.model.parameters()]
    m = run_steps(trainer, 1)[0]
    assert m["tokens/generated"] > 0 and m["length/mean"] > 0
    assert trainer.engine.version == 1  # the step's update reached the engine
    # a random Qwen2 earns no reward: with skipping, nothing trains; every parameter is untouched
    assert m["update/skipped_rows"] == 1.0 or any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
