"""``mbpp`` and ``humaneval``: code tasks from local JSONL files in those datasets' formats.

- **MBPP** (Austin et al., 2021, "Program Synthesis with Large Language Models"): one object
  per line with ``text`` (or ``prompt``, as in the sanitized split), ``code`` (reference
  solution, the SFT demonstration), ``test_list`` (assert lines), optional ``test_setup_code``
  and ``challenge_test_list``. The prompt is the description plus the first ``shown_tests``
  asserts; every assert grades (``code_asserts``: literal asserts keep their expected value
  outside the sandbox).
- **HumanEval** (Chen et al., 2021, "Evaluating Large Language Models Trained on Code"):
  ``task_id``, ``prompt`` (signature + docstring), ``canonical_solution``, ``test`` (defines
  ``check``), ``entry_point``. The completion continues the prompt (or is a fenced block with
  the whole function); prompt + completion + test + ``check(entry_point)`` must exit 0
  (``code_exit``).

Both load from local files only (no hub). The eval split is ``eval_path`` or a seeded
``eval_fraction`` of ``path``. Every data problem is a ``ConfigError`` naming file, line and field.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.code import code_asserts, code_exit
from rollwise.filter.sandbox import Sandbox
from rollwise.tasks.base import ListSource, Task
from rollwise.tasks.code import _start
from rollwise.tasks.files import read_rows
from rollwise.types import Prompt


def _need(row: dict, names: tuple[str, ...], where: str, kind: type | tuple = str):
    for name in names:
        if name in row and row[name] is not None:
            if not isinstance(row[name], kind):
                raise ConfigError(f"{where}: field {name!r} must be a {getattr(kind, '__name__', kind)}")
            return row[name]
    raise ConfigError(f"{where}: row has no field {' or '.join(map(repr, names))}; fields present: "
                      f"{', '.join(map(repr, row)) or 'none'}")


def mbpp_prompt(row: dict, pid: str, where: str, shown_tests: int) -> Prompt:
    text = _need(row, ("text", "prompt"), where)
    tests = _need(row, ("test_list",), where, list)
    if not tests or not all(isinstance(t, str) for t in tests):
        raise ConfigError(f"{where}: field 'test_list' must be a non-empty list of assert strings")
    tests = tests + [t for t in row.get("challenge_test_list") or [] if isinstance(t, str)]
    shown = "\n".join(tests[:shown_tests])
    prompt = f"{text}\nYour code should pass these tests:\n{shown}\n" if shown else f"{text}\n"
    return Prompt(id=pid, text=prompt, columns={"tests": tests, "test_setup": row.get("test_setup_code") or "",
                                                "solution": row.get("code"), "task_id": row.get("task_id")})


def humaneval_prompt(row: dict, pid: str, where: str, shown_tests: int = 0) -> Prompt:
    prompt = _need(row, ("prompt",), where)
    return Prompt(id=pid, text=prompt, columns={"test": _need(row, ("test",), where),
                                                "entry_point": _need(row, ("entry_point",), where),
                                                "solution": row.get("canonical_solution"),
                                                "task_id": row.get("task_id")})


def load_split(cfg, make, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval) prompts of ``cfg.path`` / ``cfg.eval_path`` built by ``make(row, id, where, shown)``."""

    def prompts(path: str, key: str, prefix: str) -> list[Prompt]:
        return [make(row, f"{prefix}{i}", f"file {path} line {i + 1}", cfg.shown_tests) for i, row in read_rows(path, key)]

    rows = prompts(cfg.path, "task.path", "row-")
    if cfg.eval_path is not None:
        evals = prompts(cfg.eval_path, "task.eval_path", "eval-row-")
        held = {p.text for p in evals}
        return [p for p in rows if p.text not in held], evals
    order = list(range(len(rows)))
    random.Random(f"code-file-split:{seed}").shuffle(order)
    held = set(order[: min(round(len(rows) * cfg.eval_fraction), len(rows) - 1)])
    return [p for i, p in enumerate(rows) if i not in held], [p for i, p in enumerate(rows) if i in held]


def _demonstrate(prompt: Prompt) -> str | None:
    solution = prompt.columns.get("solution")
    return str(solution) if solution else None


class _CodeFileConfig(StrictModel):
    path: str = Field(description="train problems: a JSONL file in the dataset's format")
    eval_path: str | None = Field(None, description="held-out problems; if unset, eval_fraction of path is held out")
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of path held out when eval_path is unset")
    threshold: float = Field(1.0, gt=0, le=1, description="test_threshold τ: reward 1 when pass fraction >= τ")
    partial: bool = Field(False, description="reward the fraction of tests passed instead")

    def _task(self, seed: int, make, reward, name: str, sandbox: Sandbox | None) -> Task:
        for key in ("path", "eval_path"):
            value = getattr(self, key)
            if value is not None and not Path(value).is_file():
                raise ConfigError(f"task.{key}: file '{value}' does not exist")
        train, evals = load_split(self, make, seed)
        if not train:
            raise ConfigError(f"task.path: file '{self.path}' leaves no training problems after the eval split")
        _start(sandbox)
        return Task(name=name, train=ListSource(train, seed), eval=evals, rewards={reward.__name__: reward},
                    demonstrate=_demonstrate, description=f"{self.path}: {len(train)} train, {len(evals)} eval problems")


class MBPPConfig(_CodeFileConfig):
    """MBPP-format JSONL (text, code, test_list): write a function; its asserts grade it in the sandbox."""

    name: Literal["mbpp"] = "mbpp"
    shown_tests: int = Field(1, ge=0, description="asserts shown in the prompt (all of them grade)")

    def build(self, seed: int, sandbox: Sandbox | None = None) -> Task:
        reward = functools.update_wrapper(
            functools.partial(code_asserts, threshold=self.threshold, partial=self.partial, sandbox=sandbox),
            code_asserts)
        return self._task(seed, mbpp_prompt, reward, "mbpp", sandbox)


class HumanEvalConfig(_CodeFileConfig):
    """HumanEval-format JSONL (prompt, test, entry_point): complete the function; check() must pass."""

    name: Literal["humaneval"] = "humaneval"
    shown_tests: int = Field(0, ge=0, le=0, description="unused (HumanEval prompts carry their own examples)")

    def build(self, seed: int, sandbox: Sandbox | None = None) -> Task:
        reward = functools.update_wrapper(functools.partial(code_exit, sandbox=sandbox), code_exit)
        return self._task(seed, humaneval_prompt, reward, "humaneval", sandbox)
