"""``rollwise bench async``: the summary's arithmetic by hand, and a smoke run of the command."""

import json

import pytest
from typer.testing import CliRunner

from rollwise.bench.async_mode import accuracy_at_wall, arm_sets, staleness_histogram, summarize


def run(seed, wall, curve, shares=None, idle=None):
    """curve: [(step, wall, tokens, accuracy)]."""
    steps = [{"staleness/share_0": 1.0, **(shares or {}), **(idle or {})}] * 2
    return {"seed": seed, "curve": [{"step": s, "wall": w, "tokens": t, "accuracy": a} for s, w, t, a in curve],
            "wall_seconds": wall, "final_accuracy": curve[-1][3], "initial_accuracy": curve[0][3],
            "generated_tokens": curve[-1][2], "step_metrics": steps}


def test_accuracy_at_wall_and_staleness_histogram():
    curve = [{"wall": 0, "accuracy": 0.4}, {"wall": 10, "accuracy": 0.6}, {"wall": 20, "accuracy": 0.7}]
    assert accuracy_at_wall(curve, 9.9) == 0.4 and accuracy_at_wall(curve, 20) == 0.7
    steps = [{"staleness/share_0": 1.0}, {"staleness/share_1": 1.0}]
    assert staleness_histogram(steps) == {0: 0.5, 1: 0.5}


def test_summary_by_hand():
    runs = {
        "sync": [run(0, 100.0, [(0, 0, 0, 0.4), (10, 50, 1000, 0.5), (20, 100, 2000, 0.6)])],
        "async1": [run(0, 80.0, [(0, 0, 0, 0.4), (10, 40, 1000, 0.55), (20, 80, 2000, 0.6)],
                       shares={"staleness/share_0": 0.0, "staleness/share_1": 1.0},
                       idle={"async/generate_idle_s": 8.0, "async/update_idle_s": 20.0})],
        # replay runs twice the steps; its equal-steps numbers are read at step 20
        "rollout_replay": [run(0, 180.0, [(0, 0, 0, 0.4), (10, 45, 600, 0.55), (20, 90, 1200, 0.58),
                                          (30, 135, 1800, 0.6), (40, 180, 2400, 0.65)])],
    }
    table = summarize(runs, ["sync", "async1", "rollout_replay"], 20)
    assert table["sync"]["speedup_vs_sync"] == 1.0 and table["sync"]["tokens_ratio"] == 1.0
    a = table["async1"]
    assert a["speedup_vs_sync"] == pytest.approx(100 / 80)
    assert a["accuracy_at_equal_wall"] == 0.6 and a["sync_accuracy_at_that_wall"] == 0.5  # at 80 s sync had .5
    assert a["staleness"] == {"0": 0.0, "1": 1.0} and a["idle_fraction"] == {"generate": 0.1, "update": 0.25}
    rr = table["rollout_replay"]
    assert rr["tokens_ratio"] == pytest.approx(1800 / 2000)  # reached sync's .6 at 1,800 tokens, step 30
    assert rr["accuracy_mean"] == 0.58 and rr["wall_seconds"] == 90 and rr["speedup_vs_sync"] == pytest.approx(100 / 90)


def test_a_seed_that_never_reached_sync_counts_at_its_lower_bound():
    """Leaving out the seed that never reached sync's accuracy would read the arm from its lucky seed (0.5×)."""
    sync = [run(s, 100.0, [(0, 0, 0, 0.4), (10, 50, 1000, 0.5), (20, 100, 2000, 0.6)]) for s in (0, 1)]
    remix = [run(0, 100.0, [(0, 0, 0, 0.4), (10, 50, 1000, 0.6), (20, 100, 2000, 0.6)]),
             run(1, 100.0, [(0, 0, 0, 0.4), (10, 50, 1000, 0.5), (20, 100, 2000, 0.55)])]
    row = summarize({"sync": sync, "remix": remix}, ["sync", "remix"], 20)["remix"]
    # seed 0: 1,000 / 2,000 tokens; seed 1 never reached .6: at least its last eval's 2,000 / 2,000
    assert (row["reached"], row["tokens_ratio_seeds"]) == (1, 2)
    assert row["tokens_ratio"] == pytest.approx((0.5 * 1.0) ** 0.5)


def test_eval_every_must_divide_steps():
    from rollwise.bench.async_mode import load_async_bench_config
    from rollwise.config import ConfigError

    with pytest.raises(ConfigError, match="eval_every=7 must divide steps=60"):
        load_async_bench_config(["eval_every=7"])


def test_arm_lines():
    assert arm_sets("async2", 2, 1) == ["train.mode=async", "train.max_staleness=2", "train.generation_threads=1",
                                         "train.update_threads=1"]
    assert arm_sets("remix", 2, 1) == ["model.threads=2", "replay.method=remix"]
    assert arm_sets("sync", 2, 1) == ["model.threads=2"]


def test_bench_async_smoke(tmp_path):
    from rollwise.cli import app

    out = tmp_path / "async.json"
    # one torch thread per arm and per async side: the default (every core, half each side) oversubscribes a
    # machine running anything else and made this the suite's slowest smoke test; the threads are not what it checks
    result = CliRunner().invoke(app, ["bench", "async", "--json", str(out), "--set", "arms=[sync,async1,rollout_replay]",
                                      "--set", "sync_threads=1", "--set", "async_threads=1",
                                      "--set", "seeds=[0]", "--set", "steps=4", "--set", "sft_steps=5",
                                      "--set", "eval_size=8", "--set", "eval_every=2", "--set", "max_digits=1",
                                      "--set", "max_new_tokens=16", "--set", "prompts_per_step=4",
                                      "--set", "num_generations=4"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    table, runs = data["table"], data["runs"]
    assert set(table) == {"sync", "async1", "rollout_replay"}
    assert table["sync"]["staleness"] == {"0": 1.0}
    assert table["async1"]["staleness"]["1"] == pytest.approx(3 / 4)  # batch 0 fresh, batches 1-3 one behind
    assert [c["step"] for c in runs["sync"][0]["curve"]] == [0, 2, 4]
    assert [c["step"] for c in runs["rollout_replay"][0]["curve"]] == [0, 2, 4, 6, 8]  # twice the steps
    assert table["sync"]["speedup_vs_sync"] == 1.0  # sync against itself, seed by seed
    # one seed: the speed-up is the ratio of the walls the table reports at the equal step count
    assert table["async1"]["speedup_vs_sync"] == pytest.approx(table["sync"]["wall_seconds"]
                                                               / table["async1"]["wall_seconds"])


def test_effect_at_equal_steps_by_hand():
    """Arms pair with sync by seed and prompt at the equal-steps eval (replay's later evals are not read)."""
    def with_correct(r, correct, trace):
        for c, x in zip(r["curve"], correct):
            c["correct"] = x
        return r | {"trace": trace}

    def ones(k):
        return "1" * k + "0" * (100 - k)

    seeds = (0, 1, 2)
    sync = [with_correct(run(s, 100.0, [(0, 0, 0, 0.5), (20, 100, 2000, 0.5)]), [ones(50)] * 2, [[9.0, 0.5]] * 20)
            for s in seeds]
    nf = [with_correct(run(s, 100.0, [(0, 0, 0, 0.5), (20, 100, 2000, 0.5)]), [ones(50), x], [[8.0, 0.5]] * 20)
          for s, x in zip(seeds, ("0" + ones(50)[:-1], ones(50), ones(50)))]
    # replay: +25 prompts at step 20 on every seed, +50 at step 40 (not read); its first 20 steps are sync's
    rr = [with_correct(run(s, 180.0, [(0, 0, 0, 0.5), (20, 90, 1200, 0.75), (40, 180, 2400, 1.0)]),
                       [ones(50), ones(75), ones(100)], [[9.0, 0.5]] * 20 + [[7.0, 0.5]] * 20) for s in seeds]
    table = summarize({"sync": sync, "noise_floor": nf, "rollout_replay": rr},
                      ["sync", "noise_floor", "rollout_replay"], 20)
    assert "verdict" not in table["sync"]
    n = table["noise_floor"]
    assert n["seed_differences"] == [0.0] * 3 and n["verdict"] == "no detectable difference" and n["departs_at"] == 1
    r = table["rollout_replay"]
    assert r["seed_differences"] == [0.25] * 3 and r["verdict"] == "better" and r["ci95"][0] > 0.1
    assert r["pairs"] == 300 and r["departs_at"] is None  # its first 20 steps sampled what sync's did


def test_bench_async_noise_floor_smoke(tmp_path):
    """The noise floor: sync with other sampling seeds — other rollouts from step 1, the same eval prompts."""
    from rollwise.cli import app

    out = tmp_path / "async.json"
    result = CliRunner().invoke(app, ["bench", "async", "--json", str(out), "--set", "arms=[sync,noise_floor]",
                                      "--set", "sync_threads=1", "--set", "seeds=[0,1]", "--set", "steps=2", "--set", "sft_steps=5",
                                      "--set", "eval_size=8", "--set", "eval_every=2", "--set", "max_digits=1",
                                      "--set", "max_new_tokens=16", "--set", "prompts_per_step=4",
                                      "--set", "num_generations=4"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    nf = data["table"]["noise_floor"]
    assert nf["pairs"] == 16 and nf["departs_at"] == 1 and len(nf["seed_differences"]) == 2
    runs = data["runs"]
    assert all(len(c["correct"]) == 8 for rs in runs.values() for r in rs for c in r["curve"])
    assert [r["trace"] for r in runs["sync"]] != [r["trace"] for r in runs["noise_floor"]]
