"""What every ``rollwise`` command shares: the console, the ``--set``/``--json``/recipe options and
``friendly_errors`` (a user-fixable error is one line on stderr and exit code 2)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()

RecipeArg = Annotated[Path | None, typer.Argument(help="recipe YAML (e.g. recipes/demo.yaml)")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override: key.path=value (repeatable)")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="write results as JSON")]


def friendly_errors(fn):
    """Turn user-fixable errors (``ConfigError``: config, paths, data) into one line on stderr and
    exit code 2. Anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rollwise.config import ConfigError

        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            if os.environ.get("ROLLWISE_DEBUG"):
                raise
            Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {err}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper
