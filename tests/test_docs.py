"""The commands the README and docs/ show are commands rollwise accepts.

Every ``.venv/bin/rollwise ...`` line (continuations joined, comments dropped) is parsed by the
CLI itself, with ``--help`` appended so nothing runs: its subcommand must exist and its options
must be the command's. For ``train``,
``sft`` and ``eval`` the recipe and every ``--set key=value`` go through the run config's
validation, so a renamed or mistyped key in the docs fails here, not in a user's terminal.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollwise.cli import app
from rollwise.train.config import load_run_config

ROOT = Path(__file__).resolve().parents[1]
COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*\.venv/bin/rollwise\s+(.*)$")


def documented_commands() -> list[tuple[str, str]]:
    """(where, the arguments after ``rollwise``) for every command line in README.md and docs/*.md."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line, where = lines[i].strip(), f"{path.name}:{i + 1}"
            while line.endswith("\\") and i + 1 < len(lines):  # a continued shell line
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            m = COMMAND.match(line)
            if m:
                found.append((where, m.group(1)))
            i += 1
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) > 20
    assert any(args.startswith("train ") for _, args in COMMANDS)


@pytest.mark.parametrize("where, args", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, args):
    tokens = shlex.split(args, comments=True)
    assert_parses(tokens, where)
    if tokens[0] in ("train", "sft", "eval"):
        rest = tokens[1:]
        sets = [rest[i + 1] for i, t in enumerate(rest) if t in ("--set", "-s")]
        recipe = rest[0] if rest and not rest[0].startswith("-") and (ROOT / rest[0]).is_file() else None
        load_run_config(str(ROOT / recipe) if recipe else None, sets)  # a ConfigError names the key


def assert_parses(tokens: list[str], where: str = "") -> None:
    """The CLI parses ``tokens`` (``--help`` appended: the command itself never runs)."""
    result = CliRunner().invoke(app, [*tokens, "--help"])
    assert result.exit_code == 0, f"{where}: `rollwise {shlex.join(tokens)}`: {result.output}"


def test_a_wrong_option_is_caught():
    """The check can fail: an option `train` does not have, or a command that does not exist."""
    for tokens in (["train", "--config", "recipes/demo.yaml"], ["bench", "nosuch"]):
        with pytest.raises(AssertionError):
            assert_parses(tokens)


# -- docs/config.md is generated from the typed config ------------------------------------------
def test_config_reference_is_current():
    """docs/config.md is what the config classes say now (regenerate: python scripts/gen_config_docs.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (ROOT / "docs" / "config.md").read_text() == script.render(), (
        "docs/config.md is stale: run python scripts/gen_config_docs.py")
    assert "| replay.method=remix |" in script.render()  # the cross-section defaults are listed


def test_config_reference_reads_any_model():
    """The generator walks model_fields: a nested section, a list of items, a tagged union, ranges, defaults."""
    from typing import Annotated, Literal, Union

    from pydantic import BaseModel, Field

    from rollwise.config_reference import config_reference

    class Inner(BaseModel):
        """Inner options."""

        k: int = Field(3, ge=1, le=9, description="how | many")

    class A(BaseModel):
        name: Literal["a"] = "a"
        x: float = 0.5

    class B(BaseModel):
        name: Literal["b"] = "b"
        items: list[Inner] = Field(default_factory=lambda: [Inner()])

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner)
        pick: Annotated[Union[A, B], Field(discriminator="name")] = Field(default_factory=A)
        tags: list[str] | None = Field(None, description="labels")

    text = config_reference(Outer)
    rows = [r for r in text.splitlines() if r.startswith("| `")]
    assert "| `inner.k` | `int` (≥ 1, ≤ 9) | `3` | how \\| many |" in rows
    assert "| `tags` | `list[str]` \\| null | `null` | labels |" in rows
    assert "| `pick.x` | `float` | `0.5` | picks these keys (name: a) |" not in rows  # only name gets that text
    assert "| `pick.name` | `b` | `b` | picks these keys (name: b) |" in rows
    assert "| `pick.items[].k` | `int` (≥ 1, ≤ 9) | `3` | how \\| many |" in rows
    assert "| `pick.items` | list of items ↓ | `[{k: 3}]` | Inner options. |" in rows
    assert "`pick.name` picks one of: `a`, `b`; each has its own keys." in text
    assert "| [`inner`](#inner) | Inner options. | `k` |" in text.splitlines()


# -- links and length --------------------------------------------------------------------------
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code (links inside them are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        out.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for ``path``'s headings: lower case, markup and punctuation dropped, spaces
    to hyphens, ``-1``, ``-2`` … for repeats."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_keep_code(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def prose_keep_code(text: str) -> str:
    """``text`` without fenced blocks (a ``# comment`` in a shell block is not a heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of ``path`` whose file is not in the repository or whose #anchor is not a heading."""
    bad = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or root.resolve() not in dest.parents:
            bad.append(f"{target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_readme_has_links_to_check():
    assert len(relative_links(ROOT / "README.md")) > 20


def test_a_broken_link_is_caught(tmp_path):
    """The check can fail: a missing file, a missing heading, a link out of the repository."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Title\n\n[a](nosuch.md) [b](other.md#no-such-heading) [c](../../outside.md) [d](#title) "
                    "[g](other.md#other) `[e](code.md)` [f](https://example.org/x.md)\n")
    assert broken_links(page, root=tmp_path) == [
        "nosuch.md (no such file in the repository)",
        "other.md#no-such-heading (no heading #no-such-heading in other.md)",
        "../../outside.md (no such file in the repository)"]


def test_github_anchors_by_hand(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Tasks: reasoning-gym, and pass@k\n## `task.name: reasoning_gym`\n## April (target ≥ 1.4×: not met)\n"
                    "## Notes\n## Notes\n```bash\n# not a heading\n```\n")
    assert anchors(page) == {"tasks-reasoning-gym-and-passk", "taskname-reasoning_gym", "april-target--14-not-met",
                             "notes", "notes-1"}


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines; move detail to docs/ (issue 23: at most 250)"


# -- the Python the docs show imports what rollwise has ------------------------------------------
IMPORT = re.compile(r"^\s*from (rollwise[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$")


def documented_imports() -> list[tuple[str, str, str]]:
    """(where, module, name) for every ``from rollwise... import ...`` line in a ```python block."""
    found = []
    for path in PAGES:
        fenced = False
        for i, line in enumerate(path.read_text().splitlines()):
            if FENCE.match(line.strip()):
                fenced = line.strip().startswith("```python") if not fenced else False
                continue
            m = IMPORT.match(line) if fenced else None
            if m:
                found += [(f"{path.name}:{i + 1}", m.group(1), n.strip()) for n in m.group(2).split(",") if n.strip()]
    return found


IMPORTS = documented_imports()


@pytest.mark.parametrize("where, module, name", IMPORTS, ids=[f"{w}:{n}" for w, _, n in IMPORTS])
def test_a_documented_import_exists(where, module, name):
    import importlib

    assert hasattr(importlib.import_module(module), name), f"{where}: rollwise has no {module}.{name}"


def test_the_docs_show_imports():
    assert len(IMPORTS) > 5


def test_the_readme_lists_every_method_id():
    """Every id the registries know has a row in the README's method table (a new method gets one)."""
    from rollwise.control import CONTROLLERS
    from rollwise.generate import STRATEGIES
    from rollwise.optim.objective import PRESETS
    from rollwise.replay import REPLAY_METHODS

    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    wanted = ([f"rollout.strategy: {i}" for i in STRATEGIES] + [f"control.method: {i}" for i in CONTROLLERS]
              + [f"replay.method: {i}" for i in REPLAY_METHODS])
    missing = [w for w in wanted if not any(f"`{w}`" in row for row in rows)]
    missing += [f"objective.method: {i}" for i in PRESETS
                if not any(row.startswith(f"| `{i}` |") or f"`objective.method: {i}`" in row for row in rows)]
    assert missing == []


PATH_MENTION = re.compile(r"(?<![\w/.-])((?:src/rollwise/|tests/|scripts/|recipes/|[a-z_]+/)[\w/]*\.(?:py|yaml))\b")


def test_every_source_path_the_docs_name_exists():
    """`control/base.py`, `tests/test_loop.py`, `recipes/demo.yaml`: a file renamed in the code is renamed
    in the docs (package-relative paths are read under src/rollwise/)."""
    missing = []
    for path in PAGES:
        for i, line in enumerate(path.read_text().splitlines()):
            for name in PATH_MENTION.findall(line):
                if not any((base / name).exists() for base in (ROOT, ROOT / "src" / "rollwise")):
                    missing.append(f"{path.name}:{i + 1}: {name}")
    assert missing == []
