"""``train.mode: async`` (train/pipeline.py): the invariants of the issue, each a test.

- ``max_staleness: 0`` reproduces ``mode: sync`` exactly (same completions, rewards, losses, weights);
- staleness is bounded by construction: every trained token is at most k versions old, exactly
  k after warm-up, and nothing is dropped;
- conservation every step: started = trained + in flight;
- a run cut short (in-process) or SIGKILLed (a real process) and resumed leaves the files of the
  uninterrupted run, queued batches included (``pipeline.pt``);
- a failure on the producer thread reaches the trainer; bad combinations are ConfigErrors.
"""

import threading
from collections import deque

import pytest
import torch
from runfiles import assert_same_run, crash_and_resume, kill_and_resume

from rollwise.config import ConfigError
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer
from rollwise.train.metrics import read_metrics
from rollwise.train.pipeline import TIMING_METRICS, Pipeline, PipelineError

ASYNC = ["train.mode=async", "train.generation_threads=1"]


def sets(tmp_path, warm, name, *extra):
    return [f"output_dir={tmp_path}", f"name={name}", f"model.path={warm}", "task.max_digits=1", "task.eval_size=8",
            "model.threads=1", "train.eval_samples=2", "rollout.prompts_per_step=4", "rollout.num_generations=4",
            "rollout.max_new_tokens=24", "optim.micro_batch_size=8", "optim.lr=1e-3", *extra]


def run(tmp_path, warm, name, *extra):
    """Fit a run; return its per-step metrics (as logged) and its final weights."""
    steps = []
    with Trainer(load_run_config(None, sets(tmp_path, warm, name, *extra))) as t:
        t.prepare()
        t.fit(on_step=lambda step, m: steps.append(dict(m)))
        weights = {k: v.clone() for k, v in t.model.state_dict().items()}
    return steps, weights


def comparable(m: dict) -> dict:
    """Metrics that must be equal bit for bit. The behaviour/policy log-prob gap is compared apart,
    to float noise: it subtracts the engine's log-probs (the producer's own copy of the weights
    in async mode) from the trainer's, and two copies of one tensor may be laid out differently in
    memory (a copy vs safetensors' mmap), which moves the last bits of a matmul; so are the
    ``mismatch/*`` statistics computed from the same gap."""
    return {k: v for k, v in m.items() if not k.startswith(("time/", "async/", "logprob_gap/", "mismatch/"))}


def same_gaps(a: list[dict], b: list[dict]) -> bool:
    gap = ("logprob_gap/", "mismatch/")
    gaps = lambda ms: [v for m in ms for k, v in sorted(m.items()) if k.startswith(gap)]  # noqa: E731
    return len(gaps(a)) == len(gaps(b)) and all(abs(x - y) < 1e-6 for x, y in zip(gaps(a), gaps(b)))


def test_staleness_zero_reproduces_sync(tmp_path, warm):
    common = ["train.steps=4", "train.eval_every=2", "train.checkpoint_every=0"]
    sync, w_sync = run(tmp_path, warm, "sync", *common)
    zero, w_zero = run(tmp_path, warm, "zero", *common, *ASYNC, "train.max_staleness=0")
    assert any(m["loss"] != 0 for m in sync) and any(m["groups/zero_signal"] < 1 for m in sync)  # real updates
    assert [comparable(m) for m in sync] == [comparable(m) for m in zero]
    assert same_gaps(sync, zero)
    assert all(torch.equal(w_sync[k], w_zero[k]) for k in w_sync)
    evals = lambda name: [m for m in read_metrics(tmp_path / name) if "eval/accuracy" in m]  # noqa: E731
    assert [comparable(m) for m in evals("sync")] == [comparable(m) for m in evals("zero")]
    samples = lambda name: (tmp_path / name / "samples.jsonl").read_text()  # noqa: E731
    assert samples("sync") == samples("zero")


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_is_bounded_by_construction_and_nothing_is_dropped(tmp_path, warm, k):
    steps, _ = run(tmp_path, warm, f"k{k}", "train.steps=5", "train.eval_every=0", "train.checkpoint_every=0", *ASYNC,
                   f"train.max_staleness={k}")
    assert [m["staleness/max"] for m in steps] == [min(s, k) for s in range(5)]  # batch s sampled by version s-k
    assert all(m["staleness/mean"] == m["staleness/max"] for m in steps)  # one version per batch
    for s, m in enumerate(steps, start=1):
        assert m["async/dropped"] == 0 and m["async/trained"] == s
        assert m["async/started"] == m["async/trained"] + m["async/in_flight"]  # conservation
        assert 0 <= m["async/in_flight"] <= k + 1  # the producer is never more than k + 1 batches ahead


def test_async_learns_like_sync_and_differs_from_it(tmp_path, warm):
    """k = 1 trains on other data than sync (sampled one version behind) — the mode is not a no-op."""
    common = ["train.steps=3", "train.eval_every=0", "train.checkpoint_every=0"]
    # the objective async k >= 1 defaults to (tis_mode=token_truncate, the decoupled PPO weight), set in sync too
    sync, w_sync = run(tmp_path, warm, "sync", *common, "objective.tis_mode=token_truncate")
    one, w_one = run(tmp_path, warm, "one", *common, *ASYNC, "train.max_staleness=1")
    assert one[1]["tis/truncated_tokens"] >= 0 and "tis/masked_sequences" not in one[1]  # the default, not the mask
    assert comparable(sync[0]) | {"staleness/max": 0} == comparable(one[0]) | {"staleness/max": 0}  # step 0: same
    assert not all(torch.equal(w_sync[k], w_one[k]) for k in w_sync)
    assert one[1]["staleness/max"] == 1 and one[1]["tis/weight_mean"] > 0


@pytest.mark.parametrize("extra", [
    [*ASYNC, "train.max_staleness=2"],
    ["replay.method=rollout_replay"],  # the replay buffer's groups are in the checkpoint (replay.pt)
    [*ASYNC, "train.max_staleness=1", "replay.method=remix"],  # async + replay, ReMix's reincarnation at step 3
])
def test_resume_leaves_the_files_of_the_uninterrupted_run(tmp_path, warm, extra):
    common = ["train.steps=7", "train.eval_every=3", "train.checkpoint_every=2", *extra]

    def check(resumed):
        k = resumed.cfg.train.max_staleness if resumed.cfg.train.mode == "async" else 0
        assert resumed.state.step == 4 and [b.step for b in resumed.queued] == list(range(4, 4 + k))  # not trained

    # crash after the step-4 checkpoint: steps 4-5 and the queued batches 5-6 are lost
    crash_and_resume(lambda name: load_run_config(None, sets(tmp_path, warm, name, *common)), 5, on_resume=check)
    files = assert_same_run(tmp_path / "full", tmp_path / "cut")
    assert ("checkpoints/step_000006/pipeline.pt" in files) == ("train.mode=async" in extra)
    assert ("checkpoints/step_000006/replay.pt" in files) == any(e.startswith("replay.") for e in extra)
    logged = [m["step"] for m in read_metrics(tmp_path / "cut") if "loss" in m]
    assert logged == list(range(1, 8))


@pytest.mark.slow  # ~40 s; in-process async resume stays in the default suite, a SIGKILLed sync run in test_resume.py
def test_sigkilled_async_run_resumes_like_the_uninterrupted_run(tmp_path, warm):
    """SIGKILL a real `rollwise train --set train.mode=async` process while its producer runs ahead,
    then --resume it: the same files as the run never killed."""
    common = ["train.steps=9", "train.checkpoint_every=2", "train.eval_every=4", *ASYNC, "train.max_staleness=1"]
    run_sets = [s for s in sets(tmp_path, warm, "x", *common) if not s.startswith(("output_dir=", "name="))]
    assert_same_run(*kill_and_resume(tmp_path, run_sets, "step_000004"))


def test_a_producer_failure_reaches_the_trainer(tmp_path, warm):
    with Trainer(load_run_config(None, sets(tmp_path, warm, "fail", "train.steps=3", *ASYNC))) as t:
        t.prepare()
        collect = t.collect

        def failing(step, cursor, engine):
            if step == 1:
                raise RuntimeError("the reward server went away")
            return collect(step, cursor, engine)

        t.collect = failing
        t.step()  # batch 0 was made
        with pytest.raises(PipelineError, match="reward server went away"):
            t.step()


def test_bad_async_combinations_are_config_errors(tmp_path):
    def trainer(*extra):
        return Trainer(load_run_config(None, [f"output_dir={tmp_path}", "model.threads=1", "train.mode=async", *extra]))

    with pytest.raises(ConfigError, match=r"objective.tis_mode=none.*decoupled_ppo"):
        trainer("objective.tis_mode=none")
    with pytest.raises(ConfigError, match=r"rollout.strategy=april with train.mode=async"):
        trainer("rollout.strategy=april")
    with pytest.raises(ConfigError, match=r"generation_threads=1 and train.update_threads=2"):
        trainer("train.generation_threads=1", "train.update_threads=2")


def test_timing_metrics_are_the_only_async_numbers_a_resume_may_change():
    """The run-file comparison skips TIMING_METRICS: each must be a number the pipeline logs (a
    misspelt name would skip nothing), and the counts a resume must reproduce are not among them."""
    p = Pipeline.__new__(Pipeline)  # only the bookkeeping metrics() reads, no producer thread
    p.cond, p.queue, p.busy, p.started, p.failed = threading.Condition(), deque([None]), True, 5, 0
    p.idle = {"generate": 0.5, "update": 0.25}
    m = p.metrics(trained=3)
    assert set(TIMING_METRICS) <= set(m)
    assert {"async/trained", "async/dropped"} <= set(m) - set(TIMING_METRICS)  # compared bit for bit on resume
    assert (m["async/started"], m["async/in_flight"], m["async/queued"]) == (5, 2, 1)
    with pytest.raises(RuntimeError, match="conservation"):
        p.metrics(trained=4)  # started 5 != trained 4 + in flight 2


@pytest.mark.parametrize("mode", [[], ASYNC])
def test_rollout_replay_trains_kept_groups_again(tmp_path, warm, mode):
    """Replayed groups are earlier steps' groups (the same objects: stored log-probs, versions and
    advantages), at most 2 versions old; sync generates fewer fresh prompts, async adds them on top."""
    with Trainer(load_run_config(None, sets(tmp_path, warm, "rr", "train.steps=5", "train.eval_every=0",
                                            "train.checkpoint_every=0", "replay.method=rollout_replay", *mode))) as t:
        t.prepare()
        trained, compose = [], t.replay.compose

        def spy(fresh, *, step, version):
            groups, metrics = compose(fresh, step=step, version=version)
            trained.append((step, version, list(fresh), groups))
            return groups, metrics

        t.replay.compose = spy
        ms = [t.step() for _ in range(5)]
    served = [m.get("replay/served_groups", 0) for m in ms]
    assert sum(served) > 0
    seen = {}
    for step, version, fresh, groups in trained:
        replayed = [g for g in groups if not any(g is f for f in fresh)]
        assert len(replayed) == served[step]
        for g in replayed:
            assert id(g) in seen and 1 <= step - seen[id(g)] <= 2  # an earlier step's group, young enough
            assert version - min(v for r in g.rollouts for v in r.versions) <= 2
        for g in fresh:
            seen[id(g)] = step
        if mode:  # async: the fresh groups are all there, the replayed ones on top
            assert len(fresh) == 4
        else:
            assert len(groups) == 4 and len(fresh) == 4 - served[step]
