"""Recompute `rollwise bench async`'s "tokens to sync's final" from a committed run's JSON with the
bench's current rule (geometric mean over seeds, a seed that never reached it at its lower bound,
a 95% interval): the rule changed after docs/data/bench-async.json was written (docs/benchmarks.md).

    python scripts/async_tokens_ratios.py docs/data/bench-async.json --json docs/data/bench-async-tokens-ratios.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollwise.bench.async_mode import tokens_to_sync_final
from rollwise.bench.compare import ratio_cell


def ratios(data: dict) -> dict[str, dict]:
    steps, runs = data["settings"]["steps"], data["runs"]
    base = {r["seed"]: r for r in runs["sync"]}
    return {arm: {**tokens_to_sync_final(runs.get(arm, []), base, steps), "seeds": len(runs.get(arm, []))}
            for arm in data["settings"]["arms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--json", type=Path, help="also write the recomputed ratios here")
    args = parser.parse_args()
    out = ratios(json.loads(args.bench_json.read_text()))
    if args.json:
        args.json.write_text(json.dumps({"source": str(args.bench_json), "tokens_ratios": out}, indent=2) + "\n")
    for arm, row in out.items():
        print(f"{arm}: {ratio_cell(row)}")


if __name__ == "__main__":
    main()
