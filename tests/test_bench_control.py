"""``rollwise bench control``: the summary's arithmetic by hand, and a smoke run of the command."""

import json

import pytest
from typer.testing import CliRunner

from rollwise.bench.control import summarize, tokens_to_reach, zero_signal_share


def run(seed, curve, zero=0.5, trained=16, control=None):
    steps = [{"groups/zero_signal": zero, "groups/trained": trained, "rollouts/trained": trained * 4,
              "tokens/generated": 640.0, **(control or {})}] * 2
    return {"seed": seed, "curve": curve, "steps": 2, "wall_seconds": 10.0, "final_accuracy": curve[-1][1],
            "initial_accuracy": curve[0][1], "generated_tokens": curve[-1][0], "step_metrics": steps}


def test_tokens_to_reach_and_zero_share():
    assert tokens_to_reach([(0, 0.4), (100, 0.6), (200, 0.5)], 0.6) == 100
    assert tokens_to_reach([(0, 0.4)], 0.6) is None
    steps = [{"groups/zero_signal": 0.5, "groups/trained": 16}, {"groups/zero_signal": 0.0, "groups/trained": 8}]
    assert zero_signal_share(steps) == pytest.approx(8 / 24)


def test_summary_by_hand():
    runs = {
        "none": [run(0, [(0, 0.4), (100, 0.5), (200, 0.6)]), run(1, [(0, 0.4), (100, 0.7), (200, 0.7)])],
        "vade": [run(0, [(0, 0.4), (60, 0.6), (200, 0.8)], control={"control/pool": 3.0}),
                 run(1, [(0, 0.4), (100, 0.6), (200, 0.6)], zero=0.0)],
    }
    table = summarize(runs, ["none", "vade"])
    assert table["none"]["tokens_ratio"] == 1.0 and table["none"]["accuracy_mean"] == pytest.approx(0.65)
    v = table["vade"]
    assert v["accuracy_mean"] == pytest.approx(0.7) and v["accuracy_spread"] == pytest.approx(0.2)
    assert (v["tokens_ratio"], v["reached"]) == (pytest.approx(60 / 200), 1)  # seed 1 never reached .7
    assert v["zero_signal_share"] == pytest.approx(0.25) and v["control"] == {"control/pool": 3.0}
    assert v["tokens_per_trained_rollout"] == 10.0  # 640 tokens for 16 groups x 4 rollouts


def test_bench_control_smoke(tmp_path):
    """Two arms on arith from a barely trained model: all groups flat, so dynamic sampling refills to its cap."""
    from rollwise.cli import app

    out = tmp_path / "control.json"
    result = CliRunner().invoke(app, ["bench", "control", "--json", str(out), "--set", "tasks=[arith]",
                                      "--set", "arms=[none,dynamic_sampling,arrol]", "--set", "seeds=[0]",
                                      "--set", "sft_steps=5", "--set", "tokens=1500", "--set", "eval_size=8",
                                      "--set", "prompts_per_step=4", "--set", "arith_max_digits=2"])
    assert result.exit_code == 0, result.output
    table = json.loads(out.read_text())["tasks"]["arith"]["table"]
    assert set(table) == {"none", "dynamic_sampling", "arrol"}
    assert table["none"]["steps"] >= 1 and table["none"]["control"] == {}
    ds = table["dynamic_sampling"]["control"]
    assert ds["control/refill_rounds"] == 3 and ds["control/cap_hit"] == 1  # capped, not refilling forever
