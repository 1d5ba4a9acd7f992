"""scripts/async_tokens_ratios.py: the recomputed tokens ratios docs/benchmarks.md quotes come from the
committed bench JSON, and a seed that never reached sync's final makes its arm's cell a lower bound."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("async_tokens_ratios", ROOT / "scripts" / "async_tokens_ratios.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def test_the_committed_ratios_are_the_bench_json_recomputed():
    data = json.loads((ROOT / "docs/data/bench-async.json").read_text())
    committed = json.loads((ROOT / "docs/data/bench-async-tokens-ratios.json").read_text())["tokens_ratios"]
    assert json.loads(json.dumps(script.ratios(data))) == committed


def run(seed: int, points: list[tuple[int, int, float]]) -> dict:
    return {"seed": seed, "curve": [{"step": s, "tokens": t, "accuracy": a} for s, t, a in points]}


def test_a_seed_that_never_reached_counts_at_its_lower_bound():
    sync = [run(s, [(0, 0, .5), (10, 100, .8)]) for s in (0, 1)]
    late = [run(0, [(0, 0, .5), (10, 50, .8)]), run(1, [(0, 0, .5), (10, 200, .7)])]  # seed 1 never gets to .8
    data = {"settings": {"steps": 10, "arms": ["sync", "late"]}, "runs": {"sync": sync, "late": late}}
    row = script.ratios(data)["late"]
    assert row["reached"] == 1 and row["tokens_ratio_seeds"] == 2
    assert abs(row["tokens_ratio"] - (0.5 * 2.0) ** 0.5) < 1e-9  # geometric mean of 0.5 and the bound 200/100
    assert script.ratio_cell(row).startswith("≥1.00× (1/2)")
