"""``file``: a task from the user's own JSONL or Parquet data, mapped by field names.

Each row becomes one ``Prompt``: ``prompt_field`` gives its text, ``answer_field`` its
reference answer, and every other field (the answer's too, and the answer again as ``answer``)
goes into ``Prompt.columns``, which reach reward functions as keyword arguments (TRL-style). A
prompt field may also be a chat-style list of ``{"role", "content"}`` messages: the list is kept
in ``Prompt.messages`` (the trainer applies the tokenizer's chat template to it, and reward
functions receive prompts and completions in TRL's conversational format), and ``text`` is the
message contents joined by blank lines. A plain-string prompt is marked
``Prompt.chat_template`` unless ``chat_template`` is false: the trainer tokenizes it through the
model's chat template as one user message when the tokenizer has one (``true``: it must), and
reward functions still get the string; ``Task.check_tokenizer`` says which at start.

The task's reward, and the eval judge, is ``reward`` (a built-in or ``package.module:function``);
unset, the judge is the first of the recipe's ``rewards:`` (``Task.judge_from_rewards``) and the
reward without ``rewards:`` is ``math_answer`` on the answers (``filter/registry.py``).
Relative paths are read from the working directory, else the recipe's (``rollwise.imports``).

The eval split is ``eval_path`` when given, else a seeded ``eval_fraction`` of ``path``
(so a different run seed holds out different rows); ``eval_size`` caps it either way. Train
rows whose prompt text also appears in the eval split (or anywhere in ``eval_path``) are
dropped, so eval is held out by content, not only by row. When ``demo_field`` is set, its
value is the SFT demonstration.

Every data problem is a ``ConfigError`` naming the file, the line (JSONL, 1-based) or row
(Parquet, 0-based), and the config key to change.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from rollwise.config import ConfigError, StrictModel
from rollwise.filter.registry import builtin_rewards, reward_function
from rollwise.imports import find_file
from rollwise.tasks.base import ListSource, Task
from rollwise.tasks.labels import LabelsMode, labels_field
from rollwise.types import Prompt

_JSONL = (".jsonl", ".ndjson")
_PARQUET = (".parquet", ".pq")


class FileTaskConfig(StrictModel):
    """Your JSONL/Parquet data with a field mapping; every extra column reaches the reward functions."""

    name: Literal["file"] = "file"
    path: str = Field(description="train data: a .jsonl file (one JSON object per line) or a .parquet file")
    eval_path: str | None = Field(None, description="held-out eval data; if unset, eval_fraction of path is held out")
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="share of path held out when eval_path is unset")
    eval_size: int | None = Field(None, ge=0, description="at most this many eval prompts (a seeded sample)")
    labels: LabelsMode = labels_field()
    prompt_field: str = Field("prompt", description="field holding the prompt: a string or a list of {role, content}")
    answer_field: str | None = Field("answer", description="field holding the reference answer (null: none)")
    demo_field: str | None = Field(None, description="field holding a worked solution, used for SFT demonstrations")
    reward: str | None = Field(
        None, description="the eval judge, and the reward when `rewards:` is unset: a built-in (`rollwise list "
        "rewards`) or package.module:function (null: the first of `rewards:`, else math_answer)")
    chat_template: Literal["auto", True, False] = Field(
        "auto", description="plain-string prompts through the model's chat template as one user message: auto = "
        "when the tokenizer has one, true = required, false = never (chat-style prompts always use it)")

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, value: str | None) -> str | None:
        known = builtin_rewards()
        if value is not None and ":" not in value and value not in known:
            raise ValueError(f"unknown reward {value!r}; built-in rewards: {', '.join(known)}, "
                             "or 'package.module:function'")
        return value

    def build(self, seed: int, sandbox=None) -> Task:
        return build(self, seed, sandbox)


def _where(path: Path, index: int) -> str:
    return f"file {path} line {index + 1}" if path.suffix in _JSONL else f"file {path} row {index}"


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open("rb") as f:
        for index, raw in enumerate(f):
            try:
                line = raw.decode("utf-8").strip()
                row = json.loads(line) if line else None
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ConfigError(f"{_where(path, index)}: invalid JSON ({err})") from None
            if row is None:
                continue
            if not isinstance(row, dict):
                raise ConfigError(f"{_where(path, index)}: expected a JSON object, got {type(row).__name__}")
            yield index, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for unreadable files
        raise ConfigError(f"file {path}: cannot read as Parquet ({err})") from None
    yield from enumerate(table.to_pylist())


def read_rows(path: str, key: str) -> list[tuple[int, dict]]:
    """``(index, row)`` pairs of a JSONL or Parquet file; ``key`` is the config key naming it. A
    relative path is read from the working directory, else the recipe's (``rollwise.imports``)."""
    p = find_file(path, key)
    if not p.is_file():
        raise ConfigError(f"{key}: file '{p}' does not exist (or is not a regular file)")
    suffix = p.suffix.lower()
    if suffix not in _JSONL + _PARQUET:
        raise ConfigError(f"{key}: file '{p}' has unsupported extension '{p.suffix}' (use .jsonl or .parquet)")
    try:
        rows = list(_jsonl_rows(p) if suffix in _JSONL else _parquet_rows(p))
    except OSError as err:
        raise ConfigError(f"{key}: cannot read file '{p}' ({err.strerror or err})") from None
    if not rows:
        raise ConfigError(f"{key}: file '{p}' has no rows")
    return rows


def _field(row: dict, name: str, key: str, where: str) -> Any:
    if name not in row:
        present = ", ".join(map(repr, row)) or "none"
        raise ConfigError(f"{where}: row has no field {name!r} ({key}); fields present: {present}")
    if row[name] is None:
        raise ConfigError(f"{where}: field {name!r} ({key}) is null")
    return row[name]


def _prompt_text(value: Any, where: str, name: str) -> tuple[str, list | None]:
    """The prompt text and, for a chat-style prompt, its message list."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m for m in value
    ):
        return "\n\n".join(m["content"] for m in value), value
    raise ConfigError(f"{where}: field {name!r} (task.prompt_field) must be a string or a list of {{role, content}}")


def make_prompt(cfg: FileTaskConfig, row: dict, pid: str, where: str) -> Prompt:
    """One row as a Prompt: mapped fields taken out, every other field kept in ``columns``."""
    text, messages = _prompt_text(_field(row, cfg.prompt_field, "task.prompt_field", where), where, cfg.prompt_field)
    columns = {k: v for k, v in row.items() if k != cfg.prompt_field}  # the answer's field too, by its own name
    answer = None
    if cfg.answer_field is not None:
        answer = str(_field(row, cfg.answer_field, "task.answer_field", where))
        columns["answer"] = answer  # the mapped answer wins over any column literally named "answer"
    if cfg.demo_field is not None:
        _field(row, cfg.demo_field, "task.demo_field", where)
    return Prompt(id=pid, text=text, answer=answer, columns=columns, messages=messages,
                  chat_template=messages is None and cfg.chat_template is not False)


def _prompts(cfg: FileTaskConfig, path: str, key: str, id_prefix: str) -> list[Prompt]:
    p = find_file(path, key)
    return [make_prompt(cfg, row, f"{id_prefix}{i}", _where(p, i)) for i, row in read_rows(path, key)]


def _split(cfg: FileTaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval) prompts: eval from ``eval_path``, else a seeded fraction of ``path``."""
    rows = _prompts(cfg, cfg.path, "task.path", "row-")
    if cfg.eval_path is not None:
        evals = _prompts(cfg, cfg.eval_path, "task.eval_path", "eval-row-")
        held_texts = {p.text for p in evals}  # the whole eval file stays out of training, not just the sample
        return [p for p in rows if p.text not in held_texts], _sample(evals, cfg.eval_size, seed)
    order = list(range(len(rows)))
    random.Random(f"file-split:{seed}").shuffle(order)
    n_eval = min(round(len(rows) * cfg.eval_fraction), len(rows) - 1)
    if cfg.eval_size is not None:
        n_eval = min(n_eval, cfg.eval_size)
    held = set(order[:n_eval])
    return [p for i, p in enumerate(rows) if i not in held], [p for i, p in enumerate(rows) if i in held]


def _sample(prompts: list[Prompt], size: int | None, seed: int) -> list[Prompt]:
    if size is None or size >= len(prompts):
        return prompts
    keep = set(random.Random(f"file-eval:{seed}").sample(range(len(prompts)), size))
    return [p for i, p in enumerate(prompts) if i in keep]


def _rewards(cfg: FileTaskConfig, sandbox) -> dict:
    """The task's own reward: ``task.reward``, else math_answer on the answers, else none (then the
    recipe's ``rewards:`` must list some; ``filter.registry.resolve_rewards`` says so)."""
    if cfg.reward is not None:
        name, fn = reward_function(cfg.reward, "task.reward", builtin_rewards(sandbox))
        if name == "math_answer" and cfg.answer_field is None:
            raise ConfigError("task.reward 'math_answer' needs reference answers: set task.answer_field")
        return {name: fn}
    return {"math_answer": builtin_rewards(sandbox)["math_answer"]} if cfg.answer_field is not None else {}


def chat_template_check(setting):
    """``Task.check_tokenizer`` for ``task.chat_template``: the line the run logs at start (None when
    nothing changes: auto on a tokenizer without a template), a ConfigError for true without one."""
    def check(tokenizer) -> str | None:
        has = bool(getattr(tokenizer, "chat_template", None))
        if setting is True and not has:
            raise ConfigError("task.chat_template=true but the model's tokenizer has no chat template; set "
                              "task.chat_template=auto (plain text then) or use a chat model")
        if setting is False:
            return ("task.chat_template=false: plain prompts are tokenized as plain text, though the model has a chat "
                    "template" if has else None)
        if not has:
            return None
        return (f"task.chat_template={str(setting).lower()}: plain prompts go through the model's chat template as "
                "one user message (task.chat_template=false: as plain text)")
    return check


def build(cfg: FileTaskConfig, seed: int = 0, sandbox=None) -> Task:
    rewards = _rewards(cfg, sandbox)
    train, evals = _split(cfg, seed)
    eval_texts = {p.text for p in evals}
    train = [p for p in train if p.text not in eval_texts]
    if not train:
        raise ConfigError(f"task.path: file '{cfg.path}' leaves no training rows after holding out the eval split")
    demo_field = cfg.demo_field
    return Task(
        name="file",
        train=ListSource(train, seed),
        eval=evals,
        rewards=rewards,
        demonstrate=(lambda prompt: str(prompt.columns[demo_field])) if demo_field else None,
        description=f"{cfg.path}: {len(train)} train prompts, {len(evals)} eval prompts",
        judge_from_rewards=cfg.reward is None,
        check_tokenizer=chat_template_check(cfg.chat_template),
    )
