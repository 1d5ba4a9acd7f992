"""Typed configuration: the base class, YAML loading, ``--set`` overrides, clear errors.

Each component keeps its own config class next to it (``EngineConfig`` in ``engine/``,
``ObjectiveConfig`` in ``optim/``...); ``rollwise.train.config.RunConfig`` composes them.
Fields are documented with ``Field(description=...)`` once, and that text is what
``rollwise list`` and error messages show.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A configuration problem a user can fix; the message names the field and the fix."""


class StrictModel(BaseModel):
    """Base for every config class: unknown keys are errors, values are validated on set."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _walk(model: type[BaseModel], loc: tuple) -> tuple[type[BaseModel] | None, tuple]:
    """Follow a pydantic error location from ``model``: (config class reached, path as the user wrote it).

    A discriminated union shows up in ``loc`` as its tag (``task.arith.max_digits``); the tag
    selects the member class and is left out of the user's path (``task.max_digits``).
    """
    current: Any = model
    path: list = []
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            current = _optional_model(field.annotation) if field is not None else None
            path.append(part)
            continue
        members = [m for m in get_args(current) if isinstance(m, type) and issubclass(m, BaseModel)]
        tagged = [m for m in members if "name" in m.model_fields and part in get_args(m.model_fields["name"].annotation)]
        if tagged:
            current = tagged[0]
        else:
            current = None
            path.append(part)
    found = current if isinstance(current, type) and issubclass(current, BaseModel) else None
    return found, tuple(path)


def _optional_model(annotation: Any) -> Any:
    """``LoraConfig | None`` → ``LoraConfig`` (an optional section's keys are the section's); else as is."""
    members = [m for m in get_args(annotation) if m is not type(None)]
    if len(members) == 1 and len(get_args(annotation)) == 2 and isinstance(members[0], type) \
            and issubclass(members[0], BaseModel):
        return members[0]
    return annotation


def _models_in(annotation: Any, suffix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """The config classes a field holds, each with how its path continues (``[]`` for a list's items)."""
    annotation = _optional_model(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(suffix, annotation)]
    if get_origin(annotation) is list:
        return [m for arg in get_args(annotation) for m in _models_in(arg, suffix + "[]")]
    if get_origin(annotation) is None:
        return []
    return [m for arg in get_args(annotation) for m in _models_in(arg, suffix)]  # a union's members share the path


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """Every config class reachable from ``model`` with its path prefix (``task.``, ``rewards[].``)."""
    found = [(prefix, model)]
    for name, field in model.model_fields.items():
        for suffix, member in _models_in(field.annotation):
            found += _sections(member, f"{prefix}{name}{suffix}.")
    return found


def _elsewhere(model: type[BaseModel], key: str, here: str) -> list[str]:
    """Where else in ``model`` a key named ``key`` lives (``lora`` → ``model.lora``): a section or
    key written at the wrong level."""
    paths = {f"{prefix}{key}" for prefix, cls in _sections(model) if key in cls.model_fields and prefix != here}
    # the shallowest only: `lora` → model.lora, not also rewards[].judge.model.lora (a judge's own model)
    depth = min((p.count(".") for p in paths), default=0)
    return sorted(p for p in paths if p.count(".") == depth)


def format_validation_error(err: ValidationError, model: type[BaseModel]) -> str:
    """Turn pydantic's error into lines a user can act on, suggesting the closest key."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) for p in _walk(model, loc)[1])
        if e["type"] == "extra_forbidden":
            parent = _walk(model, loc[:-1])[0]
            valid = sorted(parent.model_fields) if parent else []
            prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
            # the same name in another section first (rollout.lr → optim.lr), then a spelling close to one
            # here — only a very close one beside such a match (tree → rollout.tree, not seed)
            close = _elsewhere(model, str(loc[-1]), prefix)
            cutoff = 0.75 if close else 0.5
            close += [f"{prefix}{c}" for c in difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=cutoff)]
            hint = "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?" if close else ""
            lines.append(f"unknown config key '{path}'{hint} (valid here: {', '.join(valid)})")
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            tags = e.get("ctx", {}).get("expected_tags", "")
            got = e["input"].get("name") if isinstance(e["input"], dict) else e["input"]
            close = difflib.get_close_matches(str(got), [t.strip(" '") for t in str(tags).split(",")], n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"config field '{path}.name': '{got}' is not one of {tags}{hint}")
        else:
            lines.append(f"config field '{path}': {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def validate(model: type[BaseModel], data: dict) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model)) from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"optim.lr=1e-5"`` → (["optim", "lr"], 1e-5); the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' must look like key.path=value")
    key, raw = item.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override '{item}' has an empty key")
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else ""


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{item}': '{part}' is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"recipe '{p}' does not exist (pass a path to a YAML file, e.g. recipes/demo.yaml)")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe '{p}' is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe '{p}' must be a mapping of sections, got {type(data).__name__}")
    return data
