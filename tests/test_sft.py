"""The SFT warm start: a task without demonstrations names the field that gives them, and the loss
of every SFT step is logged to ``sft.jsonl`` in the run directory."""

import json

import pytest

from rollwise.config import ConfigError
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

FAST = ["task.max_digits=2", "task.eval_size=4", "rollout.prompts_per_step=2", "rollout.num_generations=2",
        "rollout.max_new_tokens=16", "train.eval_samples=0", "model.threads=1", "sft.batch_size=4"]


def _rows(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"q": f"{i}+{i}=", "a": str(2 * i), "worked": f" #{2 * i}"}) + "\n"
                            for i in range(20)))
    return path


def test_file_task_without_demo_field_names_it_before_the_run_starts(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [f"output_dir={tmp_path}", "task.name=file", f"task.path={_rows(tmp_path)}",
                               "task.prompt_field=q", "task.answer_field=a", "sft.steps=3"])
    assert "task.demo_field" in str(err.value) and "sft.steps=0" in str(err.value)
    assert not (tmp_path / "run").exists()  # refused before a run directory is made


def test_sft_without_demonstrations_names_the_field():
    from rollwise.tasks.base import Task
    from rollwise.train.sft import sft

    task = Task(name="file", train=None, eval=[], rewards={})
    with pytest.raises(ConfigError, match=r"task\.demo_field"):
        sft(None, None, task, steps=1)


def test_sft_loss_is_logged_per_step(tmp_path):
    trainer = Trainer(load_run_config(None, [f"output_dir={tmp_path}", "name=sft", *FAST, "sft.steps=3"]))
    trainer.prepare()
    lines = [json.loads(line) for line in (tmp_path / "sft" / "sft.jsonl").read_text().splitlines()]
    assert [r["sft_step"] for r in lines] == [1, 2, 3]
    assert all(r["sft/loss"] > 0 and r["sft/lr"] > 0 for r in lines)


def test_file_task_with_demo_field_logs_its_sft_loss(tmp_path):
    trainer = Trainer(load_run_config(None, [
        f"output_dir={tmp_path}", "name=demo", *FAST[1:], "task.name=file", f"task.path={_rows(tmp_path)}",
        "task.prompt_field=q", "task.answer_field=a", "task.demo_field=worked", "sft.steps=2"]))
    trainer.prepare()
    assert len((tmp_path / "demo" / "sft.jsonl").read_text().splitlines()) == 2


def test_an_engine_sampling_from_its_own_copy_samples_the_warm_started_weights(tmp_path):
    """rollout.engine_dtype=bfloat16: the engine casts the weights into its own copy; after the warm start
    that copy is the warm-started model's (the first eval and RL step sample it), and the version is
    still 0 (a token's version counts RL updates)."""
    import torch

    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=bf16", *FAST, "sft.steps=2", "sft.lr=0.05",
                                 "rollout.engine_dtype=bfloat16"])
    with Trainer(cfg) as trainer:
        trainer.prepare()
        embed = trainer.model.get_input_embeddings().weight
        copy = trainer.engine.forward.embed
        assert copy.dtype == torch.bfloat16 and torch.equal(copy, embed.detach().to(torch.bfloat16))
        assert trainer.engine.version == 0
