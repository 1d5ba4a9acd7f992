"""Smoke test of ``rollwise bench update`` on tiny settings (speed itself is never asserted)."""

import io

from rich.console import Console

from rollwise.bench.update import run_update_bench

TINY = ["arms=[skip]", "recipe=null", "steps=2", "overrides=[sft.steps=150,sft.batch_size=32,task.max_digits=1,task.eval_size=20,rollout.prompts_per_step=8,"
        "rollout.num_generations=4,rollout.max_new_tokens=24,train.eval_size=4,train.eval_samples=0]"]


def test_update_bench_runs_both_arms_on_the_same_data():
    out = io.StringIO()
    res = run_update_bench(TINY, Console(file=out, width=200))
    skip, no_skip = res["skip"], res["no_skip"]
    assert no_skip["update/skipped_rows"] == 0
    # the skip arm skipped exactly the rows of its zero-signal groups (flat groups of equal size)
    assert skip["update/skipped_rows"] == skip["groups/zero_signal"]
    assert 0 < skip["groups/zero_signal"] < 1  # a mixed batch: some rows trained, some skipped
    assert skip["reward/mean"] == no_skip["reward/mean"]  # same warm start and seed: the same first rollouts
    assert res["max_loss_difference"] < 1e-5
    assert "update time ratio" in out.getvalue()


def test_update_bench_memory_arm_runs_both_settings_in_fresh_processes():
    res = run_update_bench(["arms=[memory]", "vocab=3000", "hidden=16", "rows=2", "width=12", "budget_mb=0.05"],
                           Console(file=io.StringIO(), width=200))
    whole, chunked = res["memory"]["whole"], res["memory"]["chunked"]
    assert whole["budget_mb"] is None and chunked["budget_mb"] == 0.05
    assert whole["params"] == chunked["params"] > 3000 * 16  # the same model in both processes
    assert whole["peak_mb"] >= whole["before_mb"] > 0 and chunked["peak_mb"] >= chunked["before_mb"] > 0
