"""One-line config errors: which key, where it was written, and what to do about it.

A pydantic error carries the offending input, which for a check across several fields is the whole
config; a person needs the field names and the fix instead. Kept apart from config.py so the rules
of the config and the wording of its errors can each be read on one screen. Torch-free, and free of
backend.core.config.run_config (which passes in the known field paths), so there is no import cycle.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Sequence
from difflib import get_close_matches
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config that cannot run, with a one-line message naming the field and the fix."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 2, 4, 57, 57
"""A value's repr that stays short however big the value (a YAML alias bomb's list is 10^7 items)."""

HELP_POINTER = "every field: `finetune-studio train --help`"
"""Where the list of fields is, said at the end of every unknown-key error."""


def did_you_mean(key: str, paths: Sequence[str], sections: Iterable[str]) -> str | None:
    """The known key closest to a mistyped one (`train.max_step` -> `train.max_steps`), if any is close.

    Full dotted paths first; then the last part alone, so a field written in the wrong place or
    without its section (`max_step:` at the top) still finds its home.
    """
    candidates = list(paths) + (list(sections) if "." not in key else [])
    match = get_close_matches(key, candidates, n=1, cutoff=0.6)
    if match:
        return match[0]
    leaves: dict[str, str] = {}
    for path in paths:
        leaves.setdefault(path.rsplit(".", 1)[-1], path)
    match = get_close_matches(key.rsplit(".", 1)[-1], list(leaves), n=1, cutoff=0.75)
    return leaves[match[0]] if match else None


def short_value(value: Any) -> str:
    """The offending value as a person reads it: never a dump of a whole section or config."""
    if isinstance(value, dict):
        return "a mapping"
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def short_item(item: str, limit: int = 80) -> str:
    """A `--set key=value` as the error names it: the key whole, a long value cut."""
    return item if len(item) <= limit else item[:limit - 3] + "..."


def describe_error(err: dict[str, Any], paths: Sequence[str], sections: Iterable[str]) -> str:
    """One pydantic error as `what is wrong with which field, and the fix` (no input dump)."""
    loc = tuple(err["loc"])
    field = ".".join(str(p) for p in loc) or "(file)"
    kind = err["type"]
    if kind == "extra_forbidden":
        what = "section" if len(loc) == 1 and isinstance(err.get("input"), dict) else "field"
        guess = did_you_mean(field, paths, sections)
        fix = f"did you mean {guess}?" if guess else "check the spelling"
        return f"unknown {what} {field}; {fix} ({HELP_POINTER})"
    if err.get("input") is None and len(loc) == 1 and field in set(sections):
        return f"section {field} is empty; give its fields indented under it, or remove the line"
    if kind in ("model_type", "dict_type") and len(loc) == 1 and field in set(sections):
        return (f"section {field} must hold its fields, indented under `{field}:` (got "
                f"{short_value(err.get('input'))})")
    if kind == "value_error":  # our own validators: their sentence names the fields and the fix
        text = str(err.get("ctx", {}).get("error", err["msg"]))
        if loc and isinstance(loc[-1], int):  # an item of a list (a GRPO reward): say which one
            return f"{field}: {text}"
        return text if field in text or isinstance(err.get("input"), dict) else f"field {field}: {text}"
    return f"field {field}: {err['msg']} (got {short_value(err.get('input'))})"


def is_cross_field(err: dict[str, Any]) -> bool:
    """A check across several fields (a model validator): no single line of the file is to blame."""
    return err["type"] == "value_error" and isinstance(err.get("input"), dict)


def yaml_line(text: str, loc: Sequence[Any]) -> int | None:
    """The 1-based line where the deepest part of `loc` is written in this YAML text, if it is."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def override_for(loc: Sequence[Any], overrides: Sequence[str]) -> str | None:
    """The last `--set key=value` that wrote this key: the key itself, a list it is an item of, or
    (for an unknown section) a key inside it."""
    dotted = ".".join(str(p) for p in loc)
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if dotted and (key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + ".")):
            return item
    return None
