"""``rollwise calibrate`` and ``task.select``: pass@k per train prompt, resumable; selection by its buckets,
checked against the task it was calibrated for; ``task.data_seed`` fixes the prompts across run seeds."""

import doctest
import json

import pytest
from typer.testing import CliRunner

import rollwise.tasks.selection as selection
from rollwise.cli import app
from rollwise.config import ConfigError
from rollwise.tasks.reasoning_gym import ReasoningGymConfig, build
from rollwise.train.calibrate import calibrate
from rollwise.train.config import load_run_config

pytest.importorskip("reasoning_gym")

DATASETS = [{"name": "chain_sum", "config": {"max_terms": 2, "max_digits": 1}}]
TINY = ["task.name=reasoning_gym", "task.eval_size=4", "task.datasets=[{name: chain_sum, config: {max_terms: 2, "
        "max_digits: 1}}]", "rollout.max_new_tokens=6", "model.threads=1"]


def test_doctests():
    assert doctest.testmod(selection).failed == 0


def fake_calibration(path, counts, k=4, data_seed=0, **task):
    """A calibration of the first len(counts) train prompts with the given correct counts."""
    cfg = ReasoningGymConfig(datasets=DATASETS, eval_size=4, data_seed=data_seed, **task)
    train = build(cfg, 0).train
    rows = [{"index": i, "id": f"train-{i}", "text": train.get(i).text, "correct": c} for i, c in enumerate(counts)]
    path.write_text(json.dumps({"task": selection.task_fingerprint(cfg), "data_seed": data_seed, "k": k,
                                "prompts": rows}))
    return rows


def selected(path, run_seed=0, data_seed=0, **select):
    cfg = ReasoningGymConfig(datasets=DATASETS, eval_size=4, data_seed=data_seed, select={"path": str(path), **select})
    return build(cfg, run_seed)


def test_selection_keeps_the_shares_and_the_calibrated_prompts(tmp_path):
    path = tmp_path / "cal.json"
    rows = fake_calibration(path, [0, 0, 0, 0, 2, 2, 4, 4, 4, 1])  # never 4, mixed 3, always 3
    task = selected(path)
    pool = [task.train.get(i) for i in range(9)]  # one epoch: a third of each bucket, 3 × 3
    assert sorted(p.id for p in pool) == sorted(f"train-{i}" for i in (0, 1, 2, 4, 5, 9, 6, 7, 8))
    assert {p.id: p.text for p in pool} == {r["id"]: r["text"] for r in rows if r["id"] in {p.id for p in pool}}
    second = [task.train.get(i).id for i in range(9, 18)]
    assert sorted(second) == sorted(p.id for p in pool) and second != [p.id for p in pool]  # reshuffled per epoch
    other = selected(path, run_seed=1)  # another run seed: same pool, another order
    assert sorted(other.train.get(i).id for i in range(9)) == sorted(p.id for p in pool)
    assert [p.text for p in other.eval] == [p.text for p in task.eval]  # data_seed fixes the eval split too
    only_mixed = selected(path, never=0, always=0)
    assert sorted(only_mixed.train.get(i).id for i in range(3)) == ["train-4", "train-5", "train-9"]
    two_to_one = selected(path, never=2, mixed=1, always=0)  # never 4 of 4 allows mixed 2
    assert sorted(two_to_one.train.get(i).id for i in range(6)) == ["train-0", "train-1", "train-2", "train-3",
                                                                    "train-4", "train-5"]


def test_selection_refuses_what_it_was_not_calibrated_for(tmp_path):
    path = tmp_path / "cal.json"
    fake_calibration(path, [0, 2, 4])
    with pytest.raises(ConfigError, match=r"task.select.path: .* not found.*rollwise calibrate RECIPE --out"):
        selected(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="calibrated the prompts of data seed 0; this run draws seed 3's: set "
                                          "task.data_seed: 0"):
        selected(path, data_seed=3)
    with pytest.raises(ConfigError, match="calibrated for other task settings; re-run `rollwise calibrate`"):
        build(ReasoningGymConfig(datasets=DATASETS, eval_size=4, data_seed=0, answer_format="boxed",
                                 select={"path": str(path)}), 0)
    cal = json.loads(path.read_text())
    cal["prompts"][1]["text"] = "What is 1 + 1?"
    path.write_text(json.dumps(cal))
    with pytest.raises(ConfigError, match=r"train prompt 1 is .* here but 'What is 1 \+ 1\?' in the calibration"):
        selected(path)
    fake_calibration(path, [0, 0, 2])
    with pytest.raises(ConfigError, match=r"no 'always' prompt \(never 2, mixed 1, always 0 of 3\); set "
                                          r"task.select.always: 0"):
        selected(path)
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="is not a calibration"):
        selected(tmp_path / "junk.json")


def test_data_seed_fixes_the_prompts_across_run_seeds():
    fixed = [build(ReasoningGymConfig(datasets=DATASETS, eval_size=4, data_seed=7), s) for s in (0, 1)]
    assert [p.text for p in fixed[0].eval] == [p.text for p in fixed[1].eval]
    assert [fixed[0].train.get(i).text for i in range(5)] == [fixed[1].train.get(i).text for i in range(5)]
    free = [build(ReasoningGymConfig(datasets=DATASETS, eval_size=4), s) for s in (0, 1)]
    assert [p.text for p in free[0].eval] != [p.text for p in free[1].eval]


class Stop(Exception):
    pass


def test_calibrate_counts_resumes_and_never_overwrites(tmp_path):
    cfg = load_run_config(None, TINY + ["task.data_seed=0"])
    whole = calibrate(cfg, tmp_path / "whole.json", prompts=6, k=3, chunk=2)
    assert [r["index"] for r in whole["prompts"]] == list(range(6))
    assert all(0 <= r["correct"] <= 3 and r["tokens"] > 0 for r in whole["prompts"])
    assert sum(whole["split"].values()) == 6 and whole["k"] == 3 and whole["data_seed"] == 0
    assert whole["task"] == selection.task_fingerprint(cfg.task)

    def stop_after_first(done, total):
        if done == 2:
            raise Stop

    out = tmp_path / "resumed.json"
    with pytest.raises(Stop):
        calibrate(cfg, out, prompts=6, k=3, chunk=2, on_chunk=stop_after_first)
    assert not out.exists() and len((tmp_path / "resumed.json.partial.jsonl").read_text().splitlines()) == 3
    resumed = calibrate(cfg, out, prompts=6, k=3, chunk=2)
    assert resumed["prompts"] == whole["prompts"]
    assert not (tmp_path / "resumed.json.partial.jsonl").exists()
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        calibrate(cfg, out, prompts=6, k=3)
    (tmp_path / "other.json.partial.jsonl").write_text(json.dumps({"k": 99}) + "\n")
    with pytest.raises(ConfigError, match="holds a calibration with other settings"):
        calibrate(cfg, tmp_path / "other.json", prompts=6, k=3)


def test_cli_calibrate_then_train_on_the_selection(tmp_path):
    out = tmp_path / "cal.json"
    sets = [x for kv in TINY + ["task.data_seed=0"] for x in ("--set", kv)]
    result = CliRunner().invoke(app, ["calibrate", *sets, "--out", str(out), "--prompts", "6", "--k", "2"])
    assert result.exit_code == 0, result.output
    cal = json.loads(out.read_text())
    assert f"pass@2 of 6 prompts: never {cal['split']['never']}" in result.output
    keep = {b: int(n > 0) for b, n in cal["split"].items()}  # the buckets this model filled
    from rollwise.train.loop import Trainer

    run = TINY + ["task.data_seed=0", f"task.select={{path: {out}, never: {keep['never']}, mixed: {keep['mixed']}, "
                  f"always: {keep['always']}}}", f"output_dir={tmp_path}", "name=sel", "rollout.prompts_per_step=2",
                  "rollout.num_generations=2", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0",
                  "train.eval_samples=0"]
    chosen = {r["id"] for r in selection.choose(cal["prompts"], 2, keep)}
    with Trainer(load_run_config(None, run)) as trainer:
        trainer.prepare()
        trainer.step()
        trainer.step()
        assert trainer.state.step == 2
        drawn = {trainer.task.train.get(i).id for i in range(trainer.state.cursor)}
    assert drawn and drawn <= chosen
