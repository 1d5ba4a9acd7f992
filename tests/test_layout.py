"""Dependencies point one way (DESIGN.md): train uses the stages; stages use engine, model and
the core types; the engine imports nothing of ours but the core types; nothing imports train
or cli. Checked on the source's import statements (function-level imports included)."""

import ast
from pathlib import Path

import pytest

import rollwise

ROOT = Path(rollwise.__file__).parent
# package -> rollwise packages/modules it must never import
FORBIDDEN = {
    "filter": {"tasks", "train", "cli", "bench", "generate", "optim"},
    "generate": {"tasks", "filter", "train", "cli", "bench", "optim", "control"},
    "optim": {"tasks", "filter", "train", "cli", "bench", "generate"},
    "control": {"tasks", "filter", "train", "cli", "bench", "generate", "optim"},
    "report": {"tasks", "filter", "train", "cli", "bench", "generate", "optim", "control", "engine", "model", "replay"},
    "replay": {"tasks", "filter", "train", "cli", "bench", "generate", "optim", "control", "engine", "model"},
    "engine": {"tasks", "filter", "train", "cli", "bench", "generate", "optim", "model", "eval"},
    "model": {"tasks", "filter", "train", "cli", "bench", "generate", "optim"},
    "tasks": {"train", "cli", "bench", "generate", "optim"},
    "eval": {"train", "cli", "bench", "optim"},
}


def rollwise_imports(path: Path) -> set[str]:
    """The first component under ``rollwise`` of every import in ``path`` (``rollwise.filter.x`` → ``filter``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rollwise" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_point_one_way(package):
    bad = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        wrong = rollwise_imports(path) & FORBIDDEN[package]
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert bad == {}, bad


def test_the_scan_sees_imports():
    """The check can fail: it finds the imports a module really has."""
    assert {"filter", "tasks", "train"} <= rollwise_imports(ROOT / "cli.py") | rollwise_imports(ROOT / "train" / "loop.py")
    assert "types" in rollwise_imports(ROOT / "filter" / "arith.py")
