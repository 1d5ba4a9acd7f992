"""Collect the runs of one recipe over several seeds into a JSON file and a Markdown table.

    python scripts/seeds_table.py runs/smollm2-s0 runs/smollm2-s1 runs/smollm2-s2 --json docs/data/smollm2.json

Reads each run directory's ``summary.json`` (accuracy before and after RL, steps, RL wall time,
generated tokens) and its eval curve from ``metrics.jsonl``; prints the table README.md and docs/models.md quote.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def run_record(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            curve.append({"step": m["step"], "accuracy": m["eval/accuracy"]})
    gain = summary["final_accuracy"] - summary["initial_accuracy"]
    return {"run": run_dir.name, **summary, "gain_points": round(100 * gain, 1), "eval_curve": curve}


def table(records: list[dict]) -> str:
    rows = ["| seed | before RL | after RL | gain | RL steps | RL wall time | generated tokens |",
            "|---|---|---|---|---|---|---|"]
    for r in records:
        rows.append(f"| {r['seed']} | {100 * r['initial_accuracy']:.1f}% | {100 * r['final_accuracy']:.1f}% | "
                    f"{r['gain_points']:+.1f} | {r['steps']} | {r['wall_seconds'] / 60:.1f} min | {r['generated_tokens']:,} |")
    gains = [r["gain_points"] for r in records]
    spread = f" (min {min(gains):+.1f}, max {max(gains):+.1f})" if len(gains) > 1 else ""
    rows.append(f"\nmean gain {statistics.mean(gains):+.1f} points over {len(gains)} seeds{spread}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (runs/<name>)")
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args()
    records = [run_record(r) for r in args.runs]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
