"""GRPO's prompt records read and checked, torch-free: the trainer and the Data page's preview share them.

A record holds a prompt (text, or a list of {role, content} messages) and any other columns, which
reach the reward functions by name; one without a usable prompt, or without a column a reward reads,
is refused in one line naming the file, the line and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.core.errors import bad_input
from backend.core.data.record_files import read_parts


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value)


def check_prompt(record: Any, where: str, columns: tuple[str, ...]) -> dict[str, Any]:
    """The record as a row (a copy), or a one-line refusal naming `where` and the field."""
    if not isinstance(record, dict):
        raise bad_input(f"{where}: a record must be one object of named fields")
    if "prompt" not in record:
        raise bad_input(f"{where}: GRPO needs a 'prompt' field in every record (its fields: "
                        f"{', '.join(sorted(map(str, record)))})",
                        "give every record a prompt (text or chat messages), with the columns your rewards read")
    prompt = record["prompt"]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise bad_input(f"{where}: the field 'prompt' is empty", "fill it in or remove the record")
    elif not _is_messages(prompt):
        raise bad_input(f"{where}: the field 'prompt' is {type(prompt).__name__ if prompt is not None else 'null'}, "
                        "not text or a list of {role, content} messages", "write the prompt as text or as chat messages")
    missing = [c for c in columns if c not in record or record[c] is None]
    if missing:
        raise bad_input(f"{where}: the reward reads the column {missing[0]!r}, and this record has no {missing[0]!r}",
                        f"give every record {missing[0]!r}, or change the reward's column")
    return dict(record)


def read_prompts(path: Path, columns: tuple[str, ...], limit: int | None = None) -> list[dict[str, Any]]:
    """Every record with its prompt (text or messages) and its other fields, in order; the first record
    without a usable prompt, or without a column a reward reads, is refused with its line."""
    rows: list[dict[str, Any]] = []
    for part in read_parts(path):
        for index, record in enumerate(part.rows):
            if limit is not None and len(rows) >= limit:
                return rows
            rows.append(check_prompt(record, f"{part.path} {part.locate(index)}", columns))
    if not rows:
        raise bad_input(f"{path}: no prompt to train on", "check data.path")
    return rows
