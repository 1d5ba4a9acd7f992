"""train.eval_cache: the eval of a start is computed once and read back by every run from the same
start (rollwise.eval.cache) — and only by those."""

import json

import pytest

from rollwise.eval import cache
from rollwise.eval.accuracy import EvalResult
from rollwise.train.config import load_run_config
from rollwise.train.loop import Trainer


def run(tmp_path, name, warm, *extra):
    """A 2-step run from ``warm``; (its evals by step, how many evals it computed itself)."""
    sets = [f"output_dir={tmp_path}", f"name={name}", f"model.path={warm}", "sft.steps=0", "task.max_digits=1",
            "task.eval_size=16", "model.threads=1", "train.eval_samples=0", "train.steps=2", "train.eval_every=1",
            "train.checkpoint_every=0", *extra]
    computed = []
    with Trainer(load_run_config(None, sets)) as t:
        t.prepare()
        evaluate = t.evaluate

        def counted():
            computed.append(t.state.step)
            return evaluate()

        t.evaluate = counted
        evals = {}
        t.fit(on_eval=lambda step, r: evals.__setitem__(step, (r.accuracy, r.correct)))
    return evals, computed


def test_a_second_run_from_the_same_start_reads_the_first_eval(tmp_path, warm):
    shared = f"train.eval_cache={tmp_path / 'cache'}"
    plain, computed = run(tmp_path, "plain", warm)  # no cache: every eval computed
    assert computed == [0, 1, 2]
    first, computed = run(tmp_path, "first", warm, shared, "sampling_seed=1")
    assert computed == [0, 1, 2] and len(list((tmp_path / "cache").glob("*.json"))) == 1
    second, computed = run(tmp_path, "second", warm, shared, "sampling_seed=2")  # other samples, the same start
    assert computed == [1, 2]  # step 0 was read, the later evals (weights no other run has) computed
    assert second[0] == first[0] == plain[0]  # and it is the eval the run would have computed
    assert 0 < plain[0][0] < 1  # (an eval with something to get wrong)
    summary = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert summary["initial_accuracy"] == first[0][0]


@pytest.mark.parametrize("change", ["task.eval_size=12", "rollout.max_new_tokens=5", "sft.steps=2"])
def test_another_start_or_eval_is_computed(tmp_path, warm, change):
    """Other eval prompts, other generation settings, other weights (two SFT steps more): not read."""
    shared = f"train.eval_cache={tmp_path / 'cache'}"
    run(tmp_path, "first", warm, shared)
    _, computed = run(tmp_path, "other", warm, shared, change)
    assert computed[0] == 0
    assert len(list((tmp_path / "cache").glob("*.json"))) == 2


def test_a_broken_entry_is_computed_again(tmp_path):
    result = EvalResult(0.5, {1: 0.25}, 7.0, [], {4: 0.5}, [True, False], ["eval-0", "eval-1"])
    cache.store(tmp_path, "k", result)
    assert cache.load(tmp_path, "k") == result  # pass@k keys come back as ints
    (tmp_path / "k.json").write_text('{"accuracy": 0.5')  # cut by a kill
    assert cache.load(tmp_path, "k") is None
    assert cache.load(tmp_path, "absent") is None
    assert not list(tmp_path.glob(".*.tmp"))
