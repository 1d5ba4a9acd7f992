"""scripts/seeds_table.py: the tables README.md quotes are read from run directories, nothing typed in."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "seeds_table.py"


def fake_run(root: Path, name: str, seed: int, before: float, after: float, parse: float | None) -> Path:
    run = root / name
    run.mkdir()
    summary = {"initial_accuracy": before, "final_accuracy": after, "steps": 12, "wall_seconds": 600.0,
               "cpu_seconds": 1500.0 + seed, "generated_tokens": 20000 + seed, "seed": seed}
    (run / "summary.json").write_text(json.dumps(summary))
    evals = [{"step": 0, "eval/accuracy": before}, {"step": 6, "train/loss": 0.1},
             {"step": 12, "eval/accuracy": after} | ({"eval/parse_failure_rate": parse} if parse is not None else {})]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in evals) + "\n")
    return run


def test_two_arms_over_seeds(tmp_path):
    tool = [fake_run(tmp_path, f"tool-s{s}", s, 0.3, [0.9, 0.95][s], [0.0, 0.01][s]) for s in range(2)]
    plain = [fake_run(tmp_path, f"plain-s{s}", s, 0.1, 0.12, None) for s in range(2)]
    out = tmp_path / "table.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--arm", "tool", *map(str, tool), "--arm", "no_tool",
                             *map(str, plain), "--json", str(out)], capture_output=True, text=True, check=True)
    records = json.loads(out.read_text())["arms"]
    assert [r["gain_points"] for r in records["tool"]] == [60.0, 65.0]
    assert records["tool"][1]["eval_curve"] == [{"step": 0, "accuracy": 0.3}, {"step": 12, "accuracy": 0.95}]
    assert records["tool"][1]["final_eval"] == {"eval/accuracy": 0.95, "eval/parse_failure_rate": 0.01}
    assert "| 1 | 30.0% | 95.0% | 12 | 10.0% | 12.0% | 12 |" in result.stdout
    assert "tool: mean 30.0% -> 92.5%, generated tokens 20,000-20,001, CPU minutes a run 25.0-25.0, " \
           "final parse failures 1.0% of calls at most" in result.stdout
    assert "no_tool: mean 10.0% -> 12.0%, generated tokens 20,000-20,001, CPU minutes a run 25.0-25.0\n" \
           in result.stdout + "\n"
