"""``rollwise bench control``: the summary's arithmetic by hand, and a smoke run of the command."""

import json

import pytest
from typer.testing import CliRunner

from rollwise.bench.compare import ratio_cell
from rollwise.bench.control import NOISE_FLOOR, summarize, tokens_to_reach, zero_signal_share
from rollwise.bench.stats import NO_DIFFERENCE


def ones(k, n=100):
    return "1" * k + "0" * (n - k)


def run(seed, curve, zero=0.5, trained=16, control=None, correct=ones(50), trace=None):
    steps = [{"groups/zero_signal": zero, "groups/trained": trained, "rollouts/trained": trained * 4,
              "tokens/generated": 640.0, **(control or {})}] * 2
    return {"seed": seed, "curve": curve, "steps": 2, "wall_seconds": 10.0, "final_accuracy": curve[-1][1],
            "initial_accuracy": curve[0][1], "generated_tokens": curve[-1][0], "step_metrics": steps,
            "correct": correct, "trace": trace or [[640.0, 0.5], [640.0, 0.5]]}


def test_tokens_to_reach_and_zero_share():
    assert tokens_to_reach([(0, 0.4), (100, 0.6), (200, 0.5)], 0.6) == 100
    assert tokens_to_reach([(0, 0.4)], 0.6) is None
    steps = [{"groups/zero_signal": 0.5, "groups/trained": 16}, {"groups/zero_signal": 0.0, "groups/trained": 8}]
    assert zero_signal_share(steps) == pytest.approx(8 / 24)


def test_summary_by_hand():
    runs = {
        "none": [run(0, [(0, 0.4), (100, 0.5), (200, 0.6)], correct=ones(50)),
                 run(1, [(0, 0.4), (100, 0.7), (200, 0.7)], correct=ones(40))],
        # +25 prompts of 100 on seed 0, +50 on seed 1: Δ 0.375 [0.375 ± 12.706 x 0.125], p = 0.205
        "vade": [run(0, [(0, 0.4), (60, 0.6), (200, 0.8)], control={"control/pool": 3.0}, correct=ones(75),
                     trace=[[640.0, 0.5], [600.0, 0.5]]),
                 run(1, [(0, 0.4), (100, 0.6), (200, 0.6)], zero=0.0, correct=ones(90), trace=[[500.0, 0.5]] * 2)],
        NOISE_FLOOR: [run(0, [(0, 0.4), (200, 0.6)], correct="0" + ones(50)[:-1], trace=[[630.0, 0.5]] * 2),
                      run(1, [(0, 0.4), (200, 0.7)], correct=ones(40), trace=[[620.0, 0.5]] * 2)],
    }
    table = summarize(runs, ["none", "vade", NOISE_FLOOR])
    assert table["none"]["tokens_ratio"] == 1.0 and table["none"]["accuracy_mean"] == pytest.approx(0.65)
    assert "verdict" not in table["none"]
    v = table["vade"]
    assert v["accuracy_mean"] == pytest.approx(0.7) and v["accuracy_spread"] == pytest.approx(0.2)
    # seed 0 reached .6 at 60 tokens (none: 200); seed 1 never reached .7 — it counts at its lower bound,
    # its last eval's 200 tokens over none's 100: the geometric mean of 0.3 and 2.0, shown "≥"
    assert (v["tokens_ratio"], v["reached"], v["tokens_ratio_seeds"]) == (pytest.approx((0.3 * 2.0) ** 0.5), 1, 2)
    assert ratio_cell(v).startswith("≥0.77× (1/2)")
    assert v["zero_signal_share"] == pytest.approx(0.25) and v["control"] == {"control/pool": 3.0}
    assert v["tokens_per_trained_rollout"] == 10.0  # 640 tokens for 16 groups x 4 rollouts
    assert v["seed_differences"] == [0.25, 0.5] and v["difference"] == pytest.approx(0.375)
    assert v["ci95"] == pytest.approx([0.375 - 12.7062 * 0.125, 0.375 + 12.7062 * 0.125], abs=1e-3)
    assert v["verdict"] == NO_DIFFERENCE and v["p"] == pytest.approx(0.2048, abs=1e-3)  # t = 3 on 1 df
    assert (v["pairs"], v["departs_at"]) == (200, 1)  # seed 0 parts at step 2, seed 1 at step 1
    nf = table[NOISE_FLOOR]
    assert nf["seed_differences"] == [0.0, 0.0] and nf["verdict"] == NO_DIFFERENCE and nf["departs_at"] == 1
    assert v["p_holm"] == pytest.approx(v["p"]) and "p_holm" not in nf  # vade: the family's one method arm


def test_a_verdict_cell_carries_its_holm_p():
    from rollwise.bench.ledger import verdict_cell

    assert verdict_cell({"verdict": "worse", "p": 0.044, "p_holm": 0.2198}) == "worse (Holm p 0.220)"
    assert verdict_cell({"verdict": NO_DIFFERENCE, "p": 0.5, "p_holm": 1.0}) == NO_DIFFERENCE
    assert verdict_cell({}) == "—"


def test_bench_control_smoke(tmp_path):
    """Two arms on arith from a barely trained model: all groups flat, so dynamic sampling refills to its cap."""
    from rollwise.cli import app

    out = tmp_path / "control.json"
    result = CliRunner().invoke(app, ["bench", "control", "--json", str(out), "--set", "tasks=[arith]",
                                      "--set", "arms=[none,dynamic_sampling,arrol]", "--set", "seeds=[0]",
                                      "--set", "sft_steps=5", "--set", "tokens=1500", "--set", "eval_size=8",
                                      "--set", "prompts_per_step=4", "--set", "arith_max_digits=2"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())["tasks"]["arith"]
    table, runs = data["table"], data["runs"]
    assert set(table) == {"none", "dynamic_sampling", "arrol", NOISE_FLOOR}
    assert table["none"]["steps"] >= 1 and table["none"]["control"] == {}
    ds = table["dynamic_sampling"]["control"]
    assert ds["control/refill_rounds"] == 3 and ds["control/cap_hit"] == 1  # capped, not refilling forever
    # every run keeps its final eval's correctness per prompt; the arms pair with `none` by seed and prompt
    assert all(len(r["correct"]) == 8 and r["correct"].count("1") == round(r["final_accuracy"] * 8)
               for rs in runs.values() for r in rs)
    for arm in ("dynamic_sampling", NOISE_FLOOR):
        row = table[arm]
        assert row["pairs"] == 8 and len(row["seed_differences"]) == 1 and row["departs_at"] == 1
        assert row["ci95"] is None and row["verdict"] == "no detectable difference"  # one seed: no interval
        assert row["difference"] == pytest.approx(table[arm]["accuracy_mean"] - table["none"]["accuracy_mean"])
