"""One rule for the code and files a recipe names by a relative name: reward functions
(``rewards[].name``, ``task.reward``), environments (``rollout.environment``) and agent harnesses
(``rollout.harness``) as ``package.module:attr``, and data files (``task.path``, ``task.eval_path``).

What is guaranteed:

- a module is imported as Python imports it (installed packages, ``PYTHONPATH``); one not found
  there is looked for in the working directory, then in the recipe's directory, and the directory
  that holds it is appended to ``sys.path`` — so processes that copy ``sys.path`` (a harness's
  worker) or fork (an environment's worker) import it by the same spec;
- a module found nowhere is a ``ConfigError`` naming the field, the module, every directory looked
  in and the fix; a module that raises while it is imported (a missing dependency, a syntax error)
  names the field, its file and its error; a missing attribute names the module and the attribute;
- a relative data path is read from the working directory, else from the recipe's directory; a
  file in neither is a ``ConfigError`` naming both places.

The recipe's directory is that of the YAML file ``load_run_config`` read last (``set_recipe_dir``);
a config built without a recipe file has none, and only the working directory is searched.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from pathlib import Path

from rollwise.config import ConfigError

_recipe_dir: Path | None = None  # the directory of the recipe file being run (None: no recipe file)


def set_recipe_dir(path: str | Path | None) -> None:
    """Make ``path`` (a recipe file's directory; None = none) the second place relative names are looked up."""
    global _recipe_dir
    _recipe_dir = None if path is None else Path(path).resolve()


def search_dirs() -> list[Path]:
    """Where relative names are looked up, in order: the working directory, then the recipe's directory."""
    dirs = [Path.cwd()]
    if _recipe_dir is not None and _recipe_dir not in dirs:
        dirs.append(_recipe_dir)
    return dirs


def _places() -> str:
    dirs = search_dirs()
    named = [f"the working directory {dirs[0]}"] + [f"the recipe's directory {d}" for d in dirs[1:]]
    return " or ".join(named)


def _find(top: str) -> Path | None:
    """The first search directory holding module or package ``top``."""
    for d in search_dirs():
        if importlib.machinery.PathFinder.find_spec(top, [str(d)]) is not None:
            return d
    return None


def _import(module_name: str, field: str):
    """The module, importing it from the search directories when Python alone does not find it."""
    top = module_name.partition(".")[0]
    for attempt in range(2):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            missing = err.name or ""
            if missing != module_name and not module_name.startswith(missing + "."):
                raise ConfigError(f"{field}: importing module '{module_name}' ({_origin(top)}) failed: "
                                  f"ModuleNotFoundError: {err}") from None
            found = _find(top) if attempt == 0 else None
            if found is None:
                raise ConfigError(
                    f"{field}: cannot import module '{module_name}': it is not installed, and neither "
                    f"{_places()} holds {top}.py (or a {top}/ package); put it there, or add its directory to "
                    "PYTHONPATH") from None
            if str(found) not in sys.path:
                sys.path.append(str(found))  # after installed packages: a local file never shadows them
            importlib.invalidate_caches()
        except Exception as err:  # a user's module that raises on import: its error, one line
            raise ConfigError(f"{field}: importing module '{module_name}' ({_origin(top)}) failed: "
                              f"{type(err).__name__}: {err}") from None
    raise AssertionError("unreachable")


def _origin(top: str) -> str:
    spec = importlib.machinery.PathFinder.find_spec(top, sys.path + [str(d) for d in search_dirs()])
    return f"from {spec.origin}" if spec is not None and spec.origin else "not found"


def import_spec(spec: str, field: str, what: str = "attribute"):
    """``package.module:attr`` (``attr`` may be dotted) → the object, by the rule above; ``field``
    is the config key that named it, ``what`` the kind of object expected (for the error)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{field}: '{spec}' must look like 'package.module:{what}'")
    module = _import(module_name, field)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if obj is None:
        raise ConfigError(f"{field}: module '{module_name}' (from {getattr(module, '__file__', '?')}) has no "
                          f"{what} '{attr}'")
    return obj


def find_file(path: str, field: str) -> Path:
    """A data file: an absolute ``path`` as is; a relative one in the working directory, else in the
    recipe's directory; else a ``ConfigError`` naming where it was looked for."""
    p = Path(path)
    if p.is_absolute():
        return p
    candidates = [d / p for d in search_dirs()]
    for c in candidates:
        if c.exists():
            return c
    looked = " and ".join(str(c) for c in candidates)
    raise ConfigError(f"{field}: file '{path}' not found: looked in {looked} (a relative path is read from the "
                      "working directory, then the recipe's directory)")
