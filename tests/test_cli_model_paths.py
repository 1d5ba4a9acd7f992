"""A run directory (its latest checkpoint) or a checkpoint directory is accepted wherever a model
path is: ``model.path`` in train and eval, ``rollwise serve MODEL``. The policy is built in memory
from the run's starting model and the checkpoint's weights (a LoRA adapter merged); anything else
is one line naming what was looked for and ``rollwise export``."""

import json
import types

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.model.load import ModelConfig, load_model_and_tokenizer
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

TASK = ["task.max_digits=2", "task.eval_size=4", "train.eval_samples=0", "model.threads=1"]
FAST = [*TASK, "rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=8",
        "optim.micro_batch_size=8", "optim.lr=1e-2", "train.checkpoint_every=1", "train.eval_every=0"]


def trained(tmp_path, name, *extra, steps=2):
    """A finished run's directory and its trainer's final policy weights."""
    cfg = load_run_config(None, [f"output_dir={tmp_path}", f"name={name}", *FAST, f"train.steps={steps}", *extra])
    with Trainer(cfg) as t:
        t.prepare()
        t.fit()
        final = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    return tmp_path / name, final


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained(tmp_path_factory.mktemp("runs"), "r")


def same_weights(model, expected: dict) -> bool:
    params = dict(model.named_parameters())
    return params.keys() == expected.keys() and all(torch.equal(params[n], expected[n]) for n in expected)


def test_a_run_directory_is_its_latest_checkpoints_policy(run):
    run_dir, final = run
    model, tok = load_model_and_tokenizer(ModelConfig(path=str(run_dir), device="cpu"))
    assert same_weights(model, final)  # not init_model/: the trained policy
    assert all(p.requires_grad for p in model.parameters()) and tok.pad_token_id is not None


def test_a_checkpoint_directory_is_that_steps_policy(run):
    run_dir, _ = run
    step1 = run_dir / "checkpoints" / "step_000001"
    model, _ = load_model_and_tokenizer(ModelConfig(path=str(step1), device="cpu"))
    stored = load_file(str(step1 / "model.safetensors"))
    assert stored and all(torch.equal(model.state_dict()[n], t) for n, t in stored.items())


def test_rollwise_eval_scores_a_run_directory(run, tmp_path):
    run_dir, _ = run
    out = tmp_path / "eval.json"
    sets = [f"model.path={run_dir}", *TASK, "rollout.max_new_tokens=8"]
    args = ["eval", *[x for s in sets for x in ("--set", s)], "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "eval/accuracy" in json.loads(out.read_text())


def test_a_run_trains_from_another_runs_policy(run, tmp_path):
    run_dir, final = run
    second, _ = trained(tmp_path, "next", f"model.path={run_dir}", "optim.lr=1e-12", steps=1)
    start, _ = load_model_and_tokenizer(ModelConfig(path=str(second / "init_model"), device="cpu"))
    assert same_weights(start, final)  # its starting point is a copy of the first run's policy
    assert not (second / "init_model.json").exists()


def test_a_lora_run_is_its_merged_policy(tmp_path):
    pytest.importorskip("peft")
    from rollwise.train.export import export_merged

    run_dir, _ = trained(tmp_path, "lora", "model.lora.r=4", "model.lora.alpha=8", steps=1)
    model, _ = load_model_and_tokenizer(ModelConfig(path=str(run_dir), device="cpu"))
    exported, _ = load_model_and_tokenizer(ModelConfig(path=str(export_merged(run_dir, tmp_path / "merged")),
                                                       device="cpu"))
    assert same_weights(model, dict(exported.named_parameters()))  # what export writes, without writing it


def test_serve_accepts_a_run_directory(run, monkeypatch):
    pytest.importorskip("fastapi")
    run_dir, final = run
    seen = {}

    def fake_serve_engine(engine, tok, fmt, model_name, **kw):
        seen.update(model=engine.model if hasattr(engine, "model") else None, name=model_name)
        return types.SimpleNamespace(url="http://127.0.0.1:0", drive=lambda stop: None, close=lambda: None)

    monkeypatch.setattr("rollwise.serve.serve_engine", fake_serve_engine)
    loaded = {}
    real = load_model_and_tokenizer

    def spy(cfg, seed=0):
        loaded["model"], tok = real(cfg, seed=seed)
        return loaded["model"], tok

    monkeypatch.setattr("rollwise.model.load.load_model_and_tokenizer", spy)
    result = CliRunner().invoke(app, ["serve", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert seen["name"] == run_dir.name and same_weights(loaded["model"], final)


def test_what_is_not_a_model_says_what_was_looked_for(tmp_path):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(app, ["eval", "--set", f"model.path={tmp_path / 'empty'}"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "no config.json" in text and "config.yaml + checkpoints/" in text
    assert "rollwise export" in text


def test_a_run_without_a_checkpoint_says_so(tmp_path):
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=young", *FAST, "train.steps=0"])
    with Trainer(cfg) as t:
        t.prepare()  # config.yaml and init_model/, no checkpoint
    with pytest.raises(ConfigError, match="has no checkpoint yet.*its starting model is"):
        load_model_and_tokenizer(ModelConfig(path=str(tmp_path / "young")))
