"""The configuration reference (``docs/config.md``), generated from the typed config classes.

``config_reference(RunConfig)`` walks the pydantic models a run config nests — sections,
options of each method, list items, the members of a discriminated union such as ``task`` —
through ``model_fields`` alone, and writes one table per model: every key with its type,
range, default and the ``Field(description=...)`` text the field already carries (STYLE #8:
documented once, next to what it configures). Nothing here names a field, so a field added,
renamed or re-documented anywhere shows up on the next run of ``scripts/gen_config_docs.py``,
and ``tests/test_docs.py`` fails while ``docs/config.md`` is stale.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

COMMAND = "python scripts/gen_config_docs.py"
INTRO = """\
A run is a YAML recipe plus `--set key.path=value` overrides (`rollwise train recipes/demo.yaml
--set optim.lr=1e-5`). Every key below is a field of a typed config class kept next to the
component it configures; an unknown key is an error that names the closest valid one, a wrong
type or range names the field, and the resolved config — preset values filled in — is written
to the run directory as `config.yaml`. `null` in a default means unset (YAML `null`, or leave
the key out). An `objective.method` preset fills the `objective` fields it names where the
recipe leaves them unset (`rollwise list objectives`)."""


def config_reference(model: type[BaseModel], title: str = "Configuration reference",
                     fills: Sequence[tuple[str, str]] = ()) -> str:
    """The Markdown reference of ``model`` and every config class it nests (see the module docstring).

    ``fills``: (setting, what it fills) for every default one section's setting writes into another
    where the recipe leaves it unset (``rollwise.train.config.FILLS``), listed after the introduction.
    """
    out = [f"# {title}", "",
           f"<!-- generated from the config classes by `{COMMAND}`; edit the Field descriptions, not this file -->",
           "", INTRO, ""]
    if fills:
        out += ["Defaults one section fills in another where the recipe leaves them unset (what the recipe "
                "sets always wins; the run's `config.yaml` records the filled values):", "",
                "| when | fills |", "|---|---|", *[f"| {_cell(when)} | {_cell(what)} |" for when, what in fills], ""]
    sections = [(name, f) for name, f in model.model_fields.items() if _models(f.annotation)]
    if sections:
        out += ["| section | what it configures | keys |", "|---|---|---|"]
        out += [f"| [`{name}`](#{_anchor(name)}) | {_describe(f, _models(f.annotation))} | {_keys(f)} |"
                for name, f in sections]
        out.append("")
    out += _tables(model, "", level=2, heading="Top level")
    return "\n".join(out).rstrip() + "\n"


def _tables(model: type[BaseModel], prefix: str, level: int, heading: str) -> list[str]:
    """``model``'s table under ``heading``, then one table per config class its fields nest."""
    out = [f"{'#' * level} {heading}", ""]
    doc = _first_paragraph(model.__doc__)
    if doc:
        out += [doc, ""]
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        members = _models(field.annotation)
        if members:
            rows.append(f"| `{key}` | {_nested_type(field.annotation)} | {_nested_default(field)} | "
                        f"{_describe(field, members)} |")
            nested.append((key, field, members))
        else:
            text = field.description or (_selects(name, model) if prefix else "")
            rows.append(f"| `{key}` | {_type(field)} | {_default(field)} | {_cell(text)} |")
    out += ["| key | type | default | description |", "|---|---|---|---|", *rows, ""]
    for key, field, members in nested:
        key = key + "[]" if _is_list(field.annotation) else key
        sub = min(level + 1, 4) if prefix else level
        if len(members) == 1:
            out += _tables(members[0], f"{key}.", sub, f"`{key}`")
            continue
        tag = _discriminator(members)
        out += [f"{'#' * sub} `{key}`", "",
                f"`{key}.{tag}` picks one of: " + ", ".join(f"`{_tag(m, tag)}`" for m in members)
                + "; each has its own keys.", ""]
        for member in members:
            out += _tables(member, f"{key}.", min(sub + 1, 4), f"`{key}` with `{tag}: {_tag(member, tag)}`")
    return out


# -- reading annotations -------------------------------------------------------------------------
def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field holds: itself, the members of a union, the items of a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        for model in _models(arg):
            if model not in found:
                found.append(model)
    return found if get_origin(annotation) is not Literal else []


def _is_list(annotation: Any) -> bool:
    if get_origin(annotation) in (list, tuple):
        return True
    return any(_is_list(a) for a in get_args(annotation) if get_origin(annotation) in (Union, types.UnionType))


def _discriminator(members: list[type[BaseModel]]) -> str:
    """The field whose single ``Literal`` value tells the members apart (``task.name``)."""
    for name in members[0].model_fields:
        if all(name in m.model_fields and get_origin(m.model_fields[name].annotation) is Literal for m in members):
            return name
    raise ValueError(f"no discriminating Literal field among {[m.__name__ for m in members]}")


def _selects(name: str, model: type[BaseModel]) -> str:
    """The text of an undocumented discriminator field (``task.name: arith``): what its value picks."""
    annotation = model.model_fields[name].annotation
    if get_origin(annotation) is Literal and len(get_args(annotation)) == 1:
        return f"picks these keys ({name}: {get_args(annotation)[0]})"
    return ""


def _keys(field: FieldInfo) -> str:
    """A section's own keys, in order (a union's: its discriminator, then the choices)."""
    members = _models(field.annotation)
    if len(members) > 1:
        tag = _discriminator(members)
        return f"`{tag}` ({', '.join(_tag(m, tag) for m in members)}), then that one's keys"
    return ", ".join(f"`{n}`" for n in members[0].model_fields)


def _tag(model: type[BaseModel], field: str) -> str:
    return str(get_args(model.model_fields[field].annotation)[0])


def _type_name(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(_type_name(a).replace("`", "") for a in args)
        return f"`{getattr(origin, '__name__', str(origin))}[{inner}]`"
    if annotation is typing.Any:
        return "`any`"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def _type(field: FieldInfo) -> str:
    bounds = _bounds(field)
    return _type_name(field.annotation) + (f" ({bounds})" if bounds else "")


def _bounds(field: FieldInfo) -> str:
    """The field's range as a reader writes it: ``≥ 1``, ``< 1``, ``at least 1 item``."""
    marks = []
    for m in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(m, attr, None)
            if value is not None and isinstance(m, annotated_types.BaseMetadata):
                marks.append(f"{sign} {value}")
        if getattr(m, "min_length", None):
            marks.append(f"at least {m.min_length} item" + ("s" if m.min_length > 1 else ""))
    return ", ".join(marks)


def _nested_type(annotation: Any) -> str:
    if _is_list(annotation):
        return "list of items ↓" + (" \\| null" if type(None) in get_args(annotation) else "")
    if len(_models(annotation)) > 1:
        return "one of the classes ↓"
    return "section ↓" + (" \\| null" if type(None) in get_args(annotation) else "")


# -- values and text -------------------------------------------------------------------------
def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    return f"`{_yaml(value)}`"


def _nested_default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "`null`"
    if isinstance(value, BaseModel):
        return ""  # the section's own defaults, below
    return f"`{_yaml(value)}`"


def _yaml(value: Any) -> str:
    """A default as a recipe would write it (YAML flow style)."""
    def plain(v):
        if isinstance(v, BaseModel):
            return plain(v.model_dump())
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    text = yaml.safe_dump(plain(value), default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip().replace("|", "\\|")


def _describe(field: FieldInfo, members: list[type[BaseModel]]) -> str:
    if field.description:
        return _cell(field.description)
    if len(members) == 1 and members[0].__doc__:
        return _cell(_first_paragraph(members[0].__doc__))
    return "—"


def _first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph in Markdown: one line, ``code`` written as `code`."""
    text = " ".join((doc or "").strip().split("\n\n")[0].split())
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading ``\\`name\\```: lower case, punctuation but - and _ dropped."""
    return re.sub(r"[^a-z0-9_\- ]", "", f"`{heading}`".lower()).replace(" ", "-")
