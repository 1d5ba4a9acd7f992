"""Collect the runs of one recipe over several seeds into a JSON file and a Markdown table.

    python scripts/seeds_table.py runs/smollm2-s0 runs/smollm2-s1 runs/smollm2-s2 --json docs/data/smollm2.json

Reads each run directory's ``summary.json`` (accuracy before and after RL, steps, RL wall time,
generated tokens) and its eval curve from ``metrics.jsonl``; prints the table README.md and docs/models.md quote.
Several arms (recipes run over the same seeds), side by side, one ``--arm NAME RUN...`` each::

    python scripts/seeds_table.py --arm tool runs/a-s0 runs/a-s1 --arm no_tool runs/b-s0 runs/b-s1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def run_record(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    curve, final_eval = [], {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "eval/accuracy" in m:
            curve.append({"step": m["step"], "accuracy": m["eval/accuracy"]})
            final_eval = {k: v for k, v in m.items() if k.startswith("eval/")}  # tool use of the final policy too
    gain = summary["final_accuracy"] - summary["initial_accuracy"]
    return {"run": run_dir.name, **summary, "gain_points": round(100 * gain, 1), "eval_curve": curve,
            "final_eval": final_eval}


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


def arms_table(arms: dict[str, list[dict]]) -> str:
    """Per seed, each arm's accuracy before and after RL and its RL steps."""
    names = list(arms)
    head = "| seed | " + " | ".join(f"{n}: before RL | {n}: after RL | {n}: RL steps" for n in names) + " |"
    rows = [head, "|---" * (1 + 3 * len(names)) + "|"]
    by_seed = [{r["seed"]: r for r in arms[n]} for n in names]
    for seed in sorted({s for b in by_seed for s in b}):
        cells = []
        for b in by_seed:
            r = b.get(seed)
            cells += ["—"] * 3 if r is None else [f"{100 * r['initial_accuracy']:.1f}%",
                                                  f"{100 * r['final_accuracy']:.1f}%", str(r["steps"])]
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    for n in names:
        tokens = sorted({r["generated_tokens"] for r in arms[n]})
        cpu = [r["cpu_seconds"] / 60 for r in arms[n] if r.get("cpu_seconds") is not None]
        parse = [r["final_eval"]["eval/parse_failure_rate"] for r in arms[n]
                 if "eval/parse_failure_rate" in r.get("final_eval", {})]
        rows.append(f"\n{n}: mean {100 * statistics.mean(r['initial_accuracy'] for r in arms[n]):.1f}% -> "
                    f"{100 * statistics.mean(r['final_accuracy'] for r in arms[n]):.1f}%, "
                    f"generated tokens {tokens[0]:,}-{tokens[-1]:,}"
                    + (f", CPU minutes a run {min(cpu):.1f}-{max(cpu):.1f}" if cpu else "")
                    + (f", final parse failures {100 * max(parse):.1f}% of calls at most" if parse else ""))
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", type=Path, help="run directories (runs/<name>)")
    parser.add_argument("--arm", nargs="+", action="append", metavar=("NAME", "RUN"),
                        help="an arm's name and its run directories (repeat per arm; instead of RUNS)")
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args()
    if bool(args.runs) == bool(args.arm):
        parser.error("give run directories or --arm NAME RUN..., not both")
    if args.arm:
        arms = {name: [run_record(Path(r)) for r in runs] for name, *runs in args.arm}
        records, text = {"arms": arms}, arms_table(arms)
    else:
        records = [run_record(r) for r in args.runs]
        text = table(records)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    print(text)


if __name__ == "__main__":
    main()
