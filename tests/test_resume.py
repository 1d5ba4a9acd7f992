"""Resume, tier 3: a run cut short and resumed leaves the same run directory as the uninterrupted run.

Every file is compared (tests/runfiles.py): metrics.jsonl, samples.jsonl, summary.json,
config.yaml, init_model/, and each checkpoint's weights, optimizer, scheduler, RNG,
strategy state and controller state (PromptStats included) — timings aside. One case loses work in-process; the other SIGKILLs a real
``rollwise train`` process after a checkpoint and resumes it with ``--resume``.
"""


import pytest
from runfiles import assert_same_run, crash_and_resume, kill_and_resume

from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.metrics import read_metrics

FAST = [
    "task.max_digits=1", "task.eval_size=8", "rollout.prompts_per_step=4", "rollout.num_generations=4",
    "rollout.max_new_tokens=32", "train.eval_samples=2", "optim.micro_batch_size=8", "model.threads=1",
    "sft.steps=10", "sft.batch_size=8",
]


def fast(warm) -> list[str]:
    """From the suite's warm start (conftest.py), whose groups come back mixed, so the runs compared really
    train (a tiny model from scratch scored 0 on every rollout: zero loss, nothing moved but weight decay);
    a short SFT on top still makes the init_model/ a resume must keep."""
    return [f"model.path={warm}", *FAST]


def config(tmp_path, warm, name, *extra):
    return load_run_config(None, [f"output_dir={tmp_path}", f"name={name}", *fast(warm), *extra])


@pytest.mark.parametrize("extra", [
    ["optim.schedule=cosine", "optim.num_iterations=2"],
    ["rollout.strategy=april", "rollout.april.over_provision=2"],
    ["control.method=vade"],  # controller state: Beta posteriors, the seen pool
    ["control.method=gdro", "rollout.strategy=tree"],  # the bins' loss EMAs
    ["control.method=dynamic_sampling"],  # refills move the data cursor
    ["control.method=arrol", "control.arrol.min_examples=16"],  # the probe's buffer and weights
    ["rollout.environment=calculator", "rollout.max_turns=2"],  # episodes: done within their step
    ["rewards=[{name: pow3r}]"],  # the criteria's smoothed weights (rewards.pt)
    ["rewards=[{name: weaver, weaver: {window: 64}}]"],  # the fit's window, full by the checkpoint
    ["objective.method=dph_rl", "objective.dph_pool=3"],  # the initial policy's samples (dph_pool.pt)
    ["control.method=difficulty_select"],  # the kept embeddings: neither recomputed nor charged again
])
def test_resume_leaves_the_files_of_the_uninterrupted_run(tmp_path, warm, extra):
    sets = ["train.steps=8", "train.eval_every=4", "train.checkpoint_every=3", *extra]

    def lose_a_line(first):  # after step 4 was logged, before its eval: work after the step-3 checkpoint is lost
        first.log.log_samples(4, [{"lost": True}])

    def check(resumed):
        assert resumed.state.step == 3 and resumed.engine.version == 3

    crash_and_resume(lambda name: config(tmp_path, warm, name, *sets), 4, on_crash=lose_a_line, on_resume=check)

    logged = [m["step"] for m in read_metrics(tmp_path / "cut") if "loss" in m]
    assert logged == list(range(1, 9))  # the lost step-4 line was dropped, then produced again
    assert any(m["loss"] != 0 for m in read_metrics(tmp_path / "full") if "loss" in m)  # the runs really trained
    files = assert_same_run(tmp_path / "full", tmp_path / "cut")
    assert {"metrics.jsonl", "samples.jsonl", "summary.json", "config.yaml",
            "checkpoints/step_000006/model.safetensors", "checkpoints/step_000008/optimizer.pt"} <= set(files)
    controlled = any(s.startswith("control.method=") for s in extra)
    assert controlled == ("checkpoints/step_000008/controller.pt" in files)


def test_the_file_comparison_sees_a_difference(tmp_path, warm):
    """The comparison can fail: one changed metric value, or one extra samples line, is caught."""
    sets = ["train.steps=2", "train.eval_every=0", "train.checkpoint_every=1"]
    for name in ("a", "b"):
        with Trainer(config(tmp_path, warm, name, *sets)) as t:
            t.prepare()
            t.fit()
    assert_same_run(tmp_path / "a", tmp_path / "b")  # same seed, same config: equal
    with (tmp_path / "b" / "samples.jsonl").open("a") as f:
        f.write('{"step": 2, "extra": 1}\n')
    with pytest.raises(AssertionError):
        assert_same_run(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "samples.jsonl").write_text((tmp_path / "a" / "samples.jsonl").read_text())
    text = (tmp_path / "b" / "metrics.jsonl").read_text()
    (tmp_path / "b" / "metrics.jsonl").write_text(text.replace('"loss": ', '"loss": 1', 1))
    with pytest.raises(AssertionError):
        assert_same_run(tmp_path / "a", tmp_path / "b")


def test_killed_process_resumes_like_the_uninterrupted_run(tmp_path, warm):
    """SIGKILL a real `rollwise train` process after a checkpoint, then --resume it: same files."""
    sets = ["train.steps=12", "train.checkpoint_every=2", "train.eval_every=5", *fast(warm)]
    # past the step-6 checkpoint and its eval (step 5), so samples.jsonl has lines to cut back
    assert_same_run(*kill_and_resume(tmp_path, sets, "step_000006"))
