"""The config fields as `--help` text, generated from the RunConfig models.

Every field's docstring is already its description (the studio's tooltip); printing them from the
models means a new field is in the help the moment it exists, with its type, limits and default.
Torch-free.
"""

from __future__ import annotations

import shutil
import textwrap
import types
import typing
from typing import Any

from pydantic.fields import FieldInfo

from backend.core.config.run_config import RunConfig, section_models, yaml_scalar

HEAD_ROOM = 24
"""A field's description starts on its own line when the name and type leave less than this."""


def type_text(info: FieldInfo) -> str:
    """`int >= 1`, `float in (0, 1]`, `lora|dora|full`, `list of adapter`, `int >= 1 or null`."""
    text = _annotation_text(info.annotation)
    bounds = _bounds_text(info)
    optional = text.endswith(" or null")
    if bounds:
        text = text.removesuffix(" or null") + bounds + (" or null" if optional else "")
    return text


def _annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_annotation_text(a) for a in inner)
        return text + " or null" if type(None) in args else text
    if origin is list:
        return "list of " + (_annotation_text(args[0]) if args else "values")
    return getattr(annotation, "__name__", str(annotation))


def field_bounds(info: FieldInfo) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low_is_exclusive, high_is_exclusive) from a field's constraints (the help and the editors)."""
    low = high = None
    low_open = high_open = False
    for item in info.metadata:
        if getattr(item, "ge", None) is not None:
            low = item.ge
        if getattr(item, "gt", None) is not None:
            low, low_open = item.gt, True
        if getattr(item, "le", None) is not None:
            high = item.le
        if getattr(item, "lt", None) is not None:
            high, high_open = item.lt, True
    return low, high, low_open, high_open


def _bounds_text(info: FieldInfo) -> str:
    """The numeric limits of a field, as a person writes a range."""
    low, high, low_open, high_open = field_bounds(info)
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {_number(low)}"
    if high is not None:
        return f" {'<' if high_open else '<='} {_number(high)}"
    return ""


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def default_text(info: FieldInfo) -> str:
    """The default as it would be written after --set (true, null, [adapter], 0.002)."""
    return yaml_scalar(info.get_default(call_default_factory=True))


def field_groups() -> list[tuple[str, list[tuple[str, FieldInfo]]]]:
    """(section title, [(dotted path, field)]) for the top-level fields and then every section."""
    sections = section_models()
    top = [(name, info) for name, info in RunConfig.model_fields.items() if name not in sections]
    groups = [("top level", top)] if top else []
    for name, model in sections.items():
        groups.append((name, [(f"{name}.{field}", info) for field, info in model.model_fields.items()]))
    return groups


def fields_epilog(width: int | None = None) -> str:
    """Every settable field as `section.field  (type, default ...)  description`, grouped by section."""
    if width is None:
        width = min(max(shutil.get_terminal_size((100, 24)).columns, 80), 100) - 2
    lines = ["config fields: write them in the YAML file under their section (train:, then",
             "  max_steps: 10), or set one for a single run with --set train.max_steps=10"]
    for title, fields in field_groups():
        lines += ["", f"{title}:"]
        for path, info in fields:
            head = f"  {path}  ({type_text(info)}, default {default_text(info)})"
            description = " ".join((info.description or "").split())
            if len(head) > width - HEAD_ROOM:
                lines += textwrap.wrap(head, width, subsequent_indent=" " * 6, break_on_hyphens=False)
                lines += textwrap.wrap(description, width, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                       break_on_hyphens=False)
            else:
                lines += textwrap.wrap(description, width, initial_indent=head + "  ", subsequent_indent=" " * 6,
                                       break_on_hyphens=False) or [head]
    return "\n".join(lines)
