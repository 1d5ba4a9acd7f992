"""A long bench run (``train_run(checkpoint_every=N)``, ``bench ablate``'s ``checkpoint_every``) killed mid-run
resumes from its last checkpoint and records what the uninterrupted run records."""

import pytest
from rich.console import Console

from rollwise.bench.harness import history, run_sets, train_run
from rollwise.train.loop import Trainer

SETS = ["model.threads=1", "task.max_digits=1", "task.eval_size=8", "rollout.prompts_per_step=2",
        "rollout.num_generations=4", "rollout.max_new_tokens=24", "optim.lr=1e-3"]


class Killed(Exception):
    pass


def no_wall(evals):
    return [{k: v for k, v in e.items() if k != "wall"} for e in evals]


@pytest.fixture
def sets(tmp_path, warm):
    """A run's lines: from the warm tiny model (conftest), so its groups carry signal."""
    return lambda name: [*run_sets(tmp_path, name, 0, eval_every=2), *SETS, f"model.path={warm}", "sft.steps=0"]


def test_a_killed_bench_run_resumes_and_records_the_uninterrupted_run(tmp_path, monkeypatch, sets):
    console = Console(quiet=True)
    whole = train_run(sets("whole"), console, "whole", tokens=700, checkpoint_every=2)
    assert len(whole.trace) >= 5 and [e["step"] for e in whole.evals][:3] == [0, 2, 4]
    assert any(r > 0 for _, r in whole.trace) and any("1" in e["correct"] for e in whole.evals)  # something to match

    step = Trainer.step
    calls = []

    def dies_at_step_5(self):
        if len(calls) == 4:  # steps 1-4 done, a checkpoint at step 4: the kill comes during step 5
            raise Killed
        calls.append(1)
        return step(self)

    monkeypatch.setattr(Trainer, "step", dies_at_step_5)
    with pytest.raises(Killed):
        train_run(sets("killed"), console, "killed", tokens=700, checkpoint_every=2)
    assert (tmp_path / "killed" / "checkpoints" / "step_000004").is_dir()
    calls.clear()
    monkeypatch.setattr(Trainer, "step", lambda self: calls.append(1) or step(self))
    resumed = train_run(sets("killed"), console, "killed", tokens=700, checkpoint_every=2)
    assert len(calls) == len(whole.trace) - 4  # it went on from step 4, not from the start
    assert resumed.trace == whole.trace and no_wall(resumed.evals) == no_wall(whole.evals)
    assert resumed.summary["final_accuracy"] == whole.summary["final_accuracy"]
    assert not (tmp_path / "killed" / "checkpoints").exists()  # a bench keeps records, not weights


def test_history_reads_what_the_callbacks_record(tmp_path, sets):
    """Without checkpoints the record comes from the callbacks; ``history`` reads the same from the files
    (but wall time, which the files hold per step)."""
    run = train_run(sets("plain"), Console(quiet=True), "plain", tokens=200, keep=("reward/mean",))
    evals, trace, steps = history(tmp_path / "plain", ("reward/mean",))
    assert no_wall(evals) == no_wall(run.evals) and trace == run.trace and steps == run.steps
    assert evals[-1]["tokens"] == run.summary["generated_tokens"]
