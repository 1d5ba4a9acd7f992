"""Dependencies point one way (DESIGN.md): train uses the stages; stages use engine, model and
the core types; the engine imports nothing of ours but the core types; nothing imports train
or cli. Checked on the source's import statements (function-level and relative imports
included) for every package and top-level module under ``src/rollwise``.

The rule table, top to bottom (a row lists what its package may import besides itself and
the core modules ``config``, ``types``, ``seeds``, ``imports`` and ``hardware``):

| package                      | may import                                       | why                       |
|------------------------------|--------------------------------------------------|---------------------------|
| cli                          | everything                                       | the front door            |
| bench                        | everything but cli                               | comparisons on top        |
| train                        | stages, engine, model, tasks, eval, report, dist, serve | the loop           |
| dist                         | engine, model, filter, generate, tasks           | workers: Generate, Filter, environments |
| serve                        | engine, generate, tasks                          | the OpenAI endpoint       |
| eval                         | engine, filter, generate                         | samples, judges           |
| tasks                        | filter                                           | a task names its reward   |
| generate                     | engine                                           | drives the engine         |
| optim                        | model                                            | policy log-probs          |
| filter                       | model, engine                                    | a judge reward runs a model (filter/judge_backends.py) |
| control replay report        | nothing                                          | records in, decisions out |
| model                        | engine                                           | packed forward            |
| engine                       | nothing                                          | token ids only            |
| config_reference             | nothing                                          | docs/config.md            |

So nothing but cli imports bench, nothing but cli and bench imports train, and only train
(and what sits above it) imports dist.
"""

import ast
from pathlib import Path

import pytest

import rollwise

ROOT = Path(rollwise.__file__).parent
CORE = {"config", "types", "seeds", "imports", "hardware"}  # every package may import these
EVERYTHING = {"bench", "cli", "config", "config_reference", "control", "dist", "engine", "eval", "filter", "generate",
              "hardware", "imports", "model", "optim", "replay", "report", "seeds", "serve", "tasks", "train", "types"}
STAGES = {"generate", "filter", "control", "replay", "optim"}
ALLOWED = {
    "cli": EVERYTHING,
    "bench": EVERYTHING - {"cli"},
    "train": STAGES | {"engine", "model", "tasks", "eval", "report", "dist", "serve"},
    "serve": {"engine", "generate", "tasks"},
    "dist": {"engine", "model", "filter", "generate", "tasks"},
    "eval": {"engine", "filter", "generate"},
    "tasks": {"filter"},
    "generate": {"engine"},
    "optim": {"model"},
    "control": set(),
    "filter": {"model", "engine"},  # model-graded rewards: the judge's local model on rollwise's engine
    "replay": set(),
    "report": set(),
    "model": {"engine"},
    "engine": set(),
    "config_reference": set(),
    "config": set(),
    "types": set(),
    "seeds": set(),
    "imports": {"config"},
    "hardware": set(),  # reads the CPU (rollwise.hardware)
}


def units() -> list[str]:
    """Every package and top-level module under ``src/rollwise`` (``__init__`` aside)."""
    return sorted(p.stem for p in ROOT.iterdir()
                  if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__"))


def files(unit: str) -> list[Path]:
    path = ROOT / unit
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def rollwise_imports(path: Path, source: str | None = None) -> set[str]:
    """The first component under ``rollwise`` of every import in ``path`` (or in ``source`` as if it
    stood at ``path``): ``rollwise.filter.x`` → ``filter``; ``from ..filter import x`` is resolved
    against ``path``'s package."""
    package = list(path.relative_to(ROOT.parent).parts[:-1])  # rollwise/generate/group.py: rollwise.generate
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom):  # relative: level 1 is this package
            base = package[: len(package) - node.level + 1]
            names = [".".join(base + ([node.module] if node.module else [a.name for a in node.names][:1]))]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rollwise" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_rule():
    """A new package or top-level module needs a row in ``ALLOWED`` (and the table above)."""
    assert units() == sorted(ALLOWED)
    assert set(ALLOWED) == EVERYTHING


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_package_imports_point_one_way(unit):
    allowed = ALLOWED[unit] | CORE | {unit}
    bad = {}
    for path in files(unit):
        wrong = rollwise_imports(path) - allowed
        if wrong:
            bad[str(path.relative_to(ROOT))] = sorted(wrong)
    assert bad == {}, bad


def test_nothing_below_imports_bench_train_or_dist():
    def importers(unit):
        return {u for u, ok in ALLOWED.items() if unit in ok and u != unit}

    assert importers("bench") == {"cli"}
    assert importers("train") == {"cli", "bench"}
    assert importers("dist") == {"cli", "bench", "train"}


def test_the_scan_sees_imports():
    """The check can fail: it finds the imports a module really has, relative ones included."""
    seen = rollwise_imports(ROOT / "cli" / "__init__.py") | rollwise_imports(ROOT / "train" / "loop.py")
    assert {"filter", "tasks", "train"} <= seen
    assert "types" in rollwise_imports(ROOT / "filter" / "arith.py")
    assert {"engine", "generate"} <= rollwise_imports(ROOT / "dist" / "worker.py")
    relative = "from ..train import loop\nfrom . import base\nfrom .. import bench\n"
    assert rollwise_imports(ROOT / "generate" / "group.py", relative) == {"train", "generate", "bench"}
    assert rollwise_imports(ROOT / "dist" / "__init__.py", "from .pool import WorkerPool\n") == {"dist"}


# An optional extra (pyproject's [project.optional-dependencies]) is imported inside functions only, so rollwise
# imports without it: module → the extra's top-level import names. A row per module that uses an extra.
EXTRAS_INSIDE_FUNCTIONS = {
    "tasks/openenv.py": {"openenv"},  # rollwise[openenv]
}


def import_time_imports(source: str) -> set[str]:
    """The top-level names a module imports when it is imported: not in function bodies."""
    found: set[str] = set()

    def visit(node) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name.split(".")[0] for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.add(child.module.split(".")[0])
            visit(child)

    visit(ast.parse(source))
    return found


@pytest.mark.parametrize("module", sorted(EXTRAS_INSIDE_FUNCTIONS))
def test_optional_extras_are_imported_inside_functions(module):
    assert import_time_imports((ROOT / module).read_text()) & EXTRAS_INSIDE_FUNCTIONS[module] == set()
    # the scan can fail: an import at module level, or in a class body or a try, is found
    assert import_time_imports("try:\n    import openenv.core\nexcept ImportError:\n    pass\n"
                               "class A:\n    from openenv import x\ndef f():\n    import ray\n") == {"openenv"}
