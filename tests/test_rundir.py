"""Run directories are never lost: a fresh run refuses a directory that holds a run (every file
left as it was) unless told ``--overwrite``; ``--resume`` continues it, with only the keys that do
not change what the run computed allowed to change (recorded in ``config_changes.jsonl``)."""

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.train import rundir
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer

FAST = ["task.max_digits=2", "task.eval_size=4", "rollout.prompts_per_step=2", "rollout.num_generations=2",
        "rollout.max_new_tokens=8", "train.eval_samples=0", "optim.micro_batch_size=8", "model.threads=1",
        "train.checkpoint_every=1", "train.eval_every=0"]


def train(tmp_path, *args, name="r", steps=2):
    sets = [f"output_dir={tmp_path}", f"name={name}", *FAST, f"train.steps={steps}"]
    argv = ["train", *[x for s in sets for x in ("--set", s)], *args]
    return CliRunner().invoke(app, argv)


def snapshot(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_a_second_run_with_the_same_name_refuses_and_keeps_every_file(tmp_path):
    first = train(tmp_path)
    assert first.exit_code == 0, first.output
    before = snapshot(tmp_path / "r")
    assert {"config.yaml", "metrics.jsonl", "summary.json", "checkpoints/step_000002/model.safetensors"} <= set(before)
    written = {p.name for p in (tmp_path / "r").iterdir()}
    assert written <= set(rundir.RUN_FILES) | set(rundir.RUN_DIRS)  # what --overwrite removes covers the run

    again = train(tmp_path)
    assert again.exit_code == 2, again.output
    assert isinstance(again.exception, SystemExit)  # one line, no traceback
    text = " ".join(again.output.split())
    assert "already holds a run" in text and "--resume" in text and "--set name=" in text and "--overwrite" in text
    assert snapshot(tmp_path / "r") == before  # byte for byte, nothing added or removed


def test_overwrite_replaces_only_what_rollwise_wrote(tmp_path):
    assert train(tmp_path, steps=2).exit_code == 0
    notes = tmp_path / "r" / "notes.txt"
    notes.write_text("mine")
    result = train(tmp_path, "--overwrite", steps=1)
    assert result.exit_code == 0, result.output
    assert notes.read_text() == "mine"  # not a file rollwise writes: kept
    assert not (tmp_path / "r" / "checkpoints" / "step_000002").exists()  # the old run's checkpoint is gone
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 1
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["train"]["steps"] == 1


def test_a_directory_without_a_run_may_be_used(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "README").write_text("my notes")
    result = train(tmp_path, steps=1)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "README").read_text() == "my notes"


def test_resume_and_overwrite_together_are_refused(tmp_path):
    result = train(tmp_path, "--resume", "--overwrite", steps=1)
    assert result.exit_code == 2 and "--resume" in result.output and "--overwrite" in result.output


def test_the_library_refuses_too(tmp_path):
    """``Trainer.prepare()`` guards the directory the same way; ``prepare(overwrite=True)`` replaces it."""
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=lib", *FAST, "train.steps=1"])
    with Trainer(cfg) as t:
        t.prepare()
        t.fit()
    before = snapshot(tmp_path / "lib")
    with Trainer(cfg) as t, pytest.raises(ConfigError, match="already holds a run"):
        t.prepare()
    assert snapshot(tmp_path / "lib") == before
    with Trainer(cfg) as t:
        t.prepare(overwrite=True)
    assert not (tmp_path / "lib" / "checkpoints").exists() and not (tmp_path / "lib" / "summary.json").exists()


def test_what_a_run_writes_is_what_overwrite_removes():
    """Files a run writes that a plain run above may not show (tree strategies, loggers, resumes)."""
    assert {"config.yaml", "trees.jsonl", "evals.jsonl", "rollouts.jsonl", "init_model.json",
            "config_changes.jsonl"} <= set(rundir.RUN_FILES)
    assert {"checkpoints", "init_model", "tensorboard", "wandb"} <= set(rundir.RUN_DIRS)


def test_resume_applies_and_records_the_keys_that_may_change(tmp_path):
    assert train(tmp_path, steps=2).exit_code == 0
    result = train(tmp_path, "--resume", "--set", "train.eval_every=1", steps=3)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    ckpt = tmp_path / "r" / "checkpoints" / "step_000002"
    assert f"resuming {tmp_path / 'r'} from step 2 (checkpoint {ckpt})" in text
    assert "train.steps: 2 → 3" in text and "train.eval_every: 0 → 1" in text
    run = tmp_path / "r"
    assert json.loads((run / "summary.json").read_text())["steps"] == 3  # the new stop applied
    assert (run / "checkpoints" / "step_000003").is_dir()
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["train"]["steps"] == 3 and config["train"]["eval_every"] == 1  # config.yaml says what ran
    lines = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert lines == [{"step": 2, "key": "train.steps", "old": 2, "new": 3},
                     {"step": 2, "key": "train.eval_every", "old": 0, "new": 1}]


@pytest.mark.parametrize("change, old, new", [("optim.lr", "0.0001", "0.5"), ("rollout.num_generations", "2", "4")])
def test_resume_refuses_a_change_to_what_the_run_computes(tmp_path, change, old, new):
    assert train(tmp_path, steps=1).exit_code == 0
    before = snapshot(tmp_path / "r")
    result = train(tmp_path, "--resume", "--set", f"{change}={new}", steps=1)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())
    assert f"{change}: {old} → {new}" in text and "model.path=" in text and "config.yaml --resume" in text
    assert snapshot(tmp_path / "r") == before


def test_a_stop_the_schedule_depends_on_is_refused(tmp_path):
    sets = [f"output_dir={tmp_path}", "name=cos", *FAST, "optim.schedule=cosine"]
    with Trainer(load_run_config(None, [*sets, "train.steps=1"])) as t:
        t.prepare()
        t.fit()
    with Trainer(load_run_config(None, [*sets, "train.steps=4"])) as t:
        with pytest.raises(ConfigError, match="optim.schedule=cosine decays the LR over train.steps"):
            t.prepare(resume=True)


def test_a_precision_key_may_name_the_dtype_auto_resolved_to_and_nothing_else(tmp_path):
    """auto → float32 on resume is the same computation when auto resolved to float32 at the run's
    start (state.json records it; an older checkpoint: what auto picks here): allowed and recorded;
    auto → bfloat16 is refused, naming why."""
    from rollwise.train.resume import ResumeRefused

    sets = [f"output_dir={tmp_path}", "name=p", *FAST]
    with Trainer(load_run_config(None, [*sets, "train.steps=1"])) as t:
        t.prepare()
        t.fit()
    state = json.loads((tmp_path / "p" / "checkpoints" / "step_000001" / "state.json").read_text())
    assert state["precision"] == {"rollout.engine_dtype": "float32", "optim.compute_dtype": "float32"}
    with Trainer(load_run_config(None, [*sets, "train.steps=2", "rollout.engine_dtype=bfloat16"])) as t:
        with pytest.raises(ResumeRefused, match=re.escape('rollout.engine_dtype: "auto" → "bfloat16" (the run '
                                                          'computes in float32)')):
            t.prepare(resume=True)
    del state["precision"]  # as a checkpoint written before runs recorded it: taken as begun here (AVX2: fp32)
    (tmp_path / "p" / "checkpoints" / "step_000001" / "state.json").write_text(json.dumps(state))
    pinned = ["train.steps=2", "rollout.engine_dtype=float32", "optim.compute_dtype=float32"]
    with Trainer(load_run_config(None, [*sets, *pinned])) as t:
        t.prepare(resume=True)
        t.fit()
    lines = [json.loads(x) for x in (tmp_path / "p" / "config_changes.jsonl").read_text().splitlines()]
    assert {(x["key"], x["old"], x["new"]) for x in lines} >= {("rollout.engine_dtype", "auto", "float32"),
                                                              ("optim.compute_dtype", "auto", "float32")}


def test_where_the_start_eval_is_cached_may_change_on_resume():
    from rollwise.train.resume import Change, refusal

    assert refusal({}, Change("train.eval_cache", "runs/a/eval_cache", "/elsewhere/eval_cache")) is None
    assert refusal({}, Change("train.eval_size", 100, 200)) is not None  # what is evaluated: refused


def test_config_changes_compare_leaves_and_sections():
    from rollwise.train.resume import config_changes

    old = {"name": "a", "model": {"lora": None, "threads": 1}, "train": {"steps": 2, "report_to": []}, "gone": 1}
    new = {"name": "b", "model": {"lora": {"r": 8}, "threads": 1}, "train": {"steps": 3, "report_to": ["wandb"]}}
    assert [str(c) for c in config_changes(old, new)] == [
        'model.lora: null → {"r": 8}', "train.steps: 2 → 3", 'train.report_to: [] → ["wandb"]']


def test_ctrl_c_names_the_last_checkpoint_and_the_command_that_resumes(tmp_path):
    """SIGINT to a real `rollwise train` after its first checkpoint: exit 130, the checkpoint and the
    exact command (recipe, every --set given, --resume) on stderr."""
    import os
    import signal
    import subprocess
    import sys
    import time

    recipe = tmp_path / "my recipe.yaml"  # a path that needs quoting in a shell
    recipe.write_text("train:\n  steps: 1000\n")
    sets = [f"output_dir={tmp_path}", "name=cc", *FAST]
    argv = [sys.executable, "-m", "rollwise.cli", "train", str(recipe), *[x for s in sets for x in ("--set", s)]]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "1000"},
                            # a user's terminal: Ctrl-C on, even when the suite itself was started with SIGINT
                            # ignored (a shell's background job), which the child would inherit and keep
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300  # a bound, not a timing assertion: the run is slow on a loaded machine
    while not (tmp_path / "cc" / "checkpoints" / "step_000001").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    err = " ".join(err.split())
    last = sorted((tmp_path / "cc" / "checkpoints").glob("step_*"))[-1]
    assert f"interrupted: last checkpoint {last} (step {int(last.name[5:])})" in err, err
    command = "rollwise train " + " ".join([f"'{recipe}'", *[f"--set {s}" for s in sets], "--resume"])
    assert command in err, err
    assert "Traceback" not in err


def test_a_ctrl_c_python_swallows_in_a_finalizer_still_stops_the_run(tmp_path, monkeypatch):
    """SIGINT while the main thread runs a ``__del__``: Python prints "Exception ignored" and would go on
    to the run's end; the interrupt is raised again at the step's end and the run stops there."""
    import signal

    from rollwise.train.loop import Trainer
    from rollwise.train.run import run_training

    class SignalsWhenCollected:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__

    real_step, steps = Trainer.step, []

    def step(self):
        metrics = real_step(self)
        steps.append(self.state.step)
        if self.state.step == 2:
            SignalsWhenCollected()  # collected at once: its KeyboardInterrupt is swallowed
        return metrics

    monkeypatch.setattr(Trainer, "step", step)
    cfg = load_run_config(None, [f"output_dir={tmp_path}", "name=fin", *FAST, "train.steps=6"])
    runner = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's Ctrl-C, whatever the runner set
    try:
        with pytest.raises(KeyboardInterrupt):
            run_training(cfg)
        assert steps == [1, 2]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
        # where SIGINT is ignored (a shell's background job), it stays ignored: the run goes on to its end
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        steps.clear()
        run_training(cfg.model_copy(update={"name": "ignored"}))
        assert steps == [1, 2, 3, 4, 5, 6] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, runner)


def test_ctrl_c_before_the_first_checkpoint_says_how_to_start_again(tmp_path):
    import io

    from rich.console import Console

    from rollwise.train.run import print_interrupted

    def said(run_dir):
        out = io.StringIO()
        print_interrupted(run_dir, None, ["name=x", "optim.lr=1e-3"], Console(file=out, width=400))
        return " ".join(out.getvalue().split())

    assert said(tmp_path / "x").endswith("start again with rollwise train --set name=x --set optim.lr=1e-3")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.yaml").write_text("{}")  # the run began (SFT, say), no checkpoint yet
    assert said(tmp_path / "x").endswith("--set optim.lr=1e-3 --overwrite")
