"""Write docs/config.md from the typed run config (``rollwise.train.config.RunConfig``).

    python scripts/gen_config_docs.py           # regenerate docs/config.md
    python scripts/gen_config_docs.py --check   # exit 1 if docs/config.md is stale (tests/test_docs.py checks it too)

The text comes from the config classes themselves (field names, types, ranges, defaults and
``Field(description=...)``): edit those, then run this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rollwise.config_reference import config_reference
from rollwise.train.config import FILLS, RunConfig

OUT = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def render() -> str:
    """docs/config.md as the config classes say it now (tests/test_docs.py compares the file with this)."""
    return config_reference(RunConfig, fills=[(fill.when, fill.fills) for fill in FILLS])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md differs from the config")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
