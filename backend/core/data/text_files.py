"""JSON, JSONL and .txt dataset files -> rows, stdlib only, with errors that name the file line.

Odd but usable shapes are read as meant, and the Part's notes say what was done: UTF-16 text with
its byte-order mark, JSONL lines that end in a comma (an array cut into lines) or start with a
byte-order mark (files joined together), and a .json file's object that wraps the only list of
records ({"data": [...]}). An object holding several such lists is refused with the keys it holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from backend.core.errors import bad_input
from backend.core.data.layouts import entry_layout

_SPACE = re.compile(r"[ \t\n\r]*")
_RECORD_KEYS = {"instruction", "output", "conversations", "messages", "text", "chosen", "rejected", "prompt"}
"""Fields of a record itself (backend.core.data.layouts): an object holding them is one record, not a wrapper."""
_TURN_KEYS = ("role", "from")
SHAPE_HINT = 'each record must be one JSON object, such as {"instruction": "...", "output": "..."}'


@dataclass
class Part:
    """The rows of one file (or one save_to_disk folder)."""

    path: Path
    rows: Sequence[dict[str, Any]]
    locate: Callable[[int], str] = field(repr=False)
    """Row index -> "line 7" (JSONL, JSON, TXT, CSV) or "row 7" (Parquet, Arrow; counted from 1)."""
    notes: tuple[str, ...] = ()
    """What was done to read an odd but usable file, one sentence each."""


def read_text_file(path: Path) -> Part:
    text, encoding_note = decode(path, path.read_bytes())
    notes = [encoding_note] if encoding_note else []
    if path.suffix.lower() == ".txt":
        records, lines = _text_blocks(text)
        locate: Callable[[int], str] = lambda i: f"line {lines[i]}"
    else:
        whole = _whole_json(path, text)
        if isinstance(whole, list):
            records, starts = whole, _LazyStarts(text, _SPACE.match(text, 0).end())
            locate = lambda i: f"line {starts[i]}"
        elif isinstance(whole, dict):
            records, locate, note = _unwrap(path, text, whole)
            notes += [note] if note else []
        else:
            records, lines, jsonl_notes = _read_jsonl(path, text)
            locate = lambda i: f"line {lines[i]}"
            notes += jsonl_notes
    if not records:
        raise bad_input(f"{path}: the dataset is empty", "add at least one example")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad_input(f"{path} {locate(index)}: expected a JSON object, got {json_type(record)}", SHAPE_HINT)
    return Part(path, records, locate, tuple(notes))


def json_type(value: Any) -> str:
    """What a JSON value is, in JSON's words (a list, a string, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    names = {list: "a list", str: "a string", int: "a number", float: "a number", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def decode(path: Path, raw: bytes) -> tuple[str, str | None]:
    """The file's text, and a note when it was not UTF-8 (UTF-16 with its byte-order mark)."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return raw.decode("utf-16"), f"{path}: read as UTF-16 text (its byte-order mark says so); UTF-8 is usual"
        except UnicodeDecodeError:
            raise bad_input(f"{path}: starts as UTF-16 text but is not", "re-save the file as UTF-8") from None
    if b"\x00" in raw[:4096]:
        head = raw[:400]
        if len(head) > 8 and head[1::2].count(0) > len(head) // 3 or head[0::2].count(0) > len(head) // 3:
            raise bad_input(f"{path}: looks like UTF-16 text without a byte-order mark", "re-save the file as UTF-8")
        raise bad_input(f"{path}: looks like a binary file, not text",
                        "pick a .jsonl, .json, .csv, .parquet or .txt dataset")
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise bad_input(f"{path} line {line}: not UTF-8 text", "re-save the file as UTF-8") from None


def _whole_json(path: Path, text: str) -> Any:
    """The file as one JSON value; None when it is not one (JSONL: one value a line)."""
    if not text.lstrip().startswith(("[", "{")):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        start = _SPACE.match(text, 0).end()
        end = text.find("\n", start)
        first = text[start:end if end >= 0 else len(text)]  # the first line with text, without copying the rest
        if exc.msg == "Extra data" or _parses(first) or _mend(first)[1]:
            return None  # several values (JSONL): each line is read, and a bad one named, on its own
        comma = exc.msg == "Expecting value" and text[exc.pos:exc.pos + 1] in ("]", "}")
        raise bad_input(f"{path} line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}"
                        f"{': a comma before the closing bracket?' if comma else ''})",
                        "fix the file: a JSON array of objects, or one object per line (JSONL)") from None


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except json.JSONDecodeError:
        return False
    return True


def _unwrap(path: Path, text: str, whole: dict[str, Any]) -> tuple[list[Any], Callable[[int], str], str | None]:
    """One object: a record itself, or (in a .json file no dataset_info.json entry describes) a
    wrapper around the only list of records ({"data": [...]})."""
    lists = [key for key, value in whole.items()
             if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)
             and not all(any(k in item for k in _TURN_KEYS) for item in value)]
    if not lists or _RECORD_KEYS & set(whole) or path.suffix.lower() != ".json" or entry_layout(path):
        first = _SPACE.match(text, 0).end()
        return [whole], lambda i: f"line {text.count(chr(10), 0, first) + 1}", None
    if len(lists) > 1:
        raise bad_input(f"{path}: a JSON object with lists of records under {', '.join(map(repr, lists))} "
                        f"(keys: {', '.join(map(repr, whole))}): cannot tell which to train on",
                        "keep only the records to train on, as a JSON array or one object per line (JSONL)")
    key = lists[0]
    records = whole[key]
    starts = _LazyStarts(text, None, key)
    note = f"{path}: the records are wrapped in a JSON object: read the {len(records)} records under {key!r}"
    return records, lambda i: f"line {starts[i]}", note


def _text_blocks(text: str) -> tuple[list[dict[str, Any]], list[int]]:
    """One document per blank-line-separated block, with the line it starts on."""
    records, lines, line = [], [], 1
    for chunk in text.split("\n\n"):
        block = chunk.strip()
        if block:
            records.append({"text": block})
            lines.append(line + chunk[: len(chunk) - len(chunk.lstrip())].count("\n"))
        line += chunk.count("\n") + 2
    return records, lines


def _read_jsonl(path: Path, text: str) -> tuple[list[Any], list[int], list[str]]:
    records, lines = [], []
    mended: dict[str, list[int]] = {}  # what was mended -> the lines
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            value, how = _mend(line)
            if how is None:
                raise bad_input(
                    f"{path} line {number}: not valid JSON ({exc.msg} at column {exc.colno})",
                    "fix or delete that line; each line must be one JSON object",
                ) from None
            records.append(value)
            mended.setdefault(how, []).append(number)
        lines.append(number)
    notes = [f"{path}: {len(at)} {'line' if len(at) == 1 else 'lines'} {how} (first: line {at[0]}); read without it"
             for how, at in mended.items()]
    return records, lines, notes


def _mend(line: str) -> tuple[Any, str | None]:
    """A JSONL line with a comma after its object, or a byte-order mark before it: the value, and what it had."""
    body, how = line.strip(), []
    if body.startswith("\ufeff"):
        body, how = body.lstrip("\ufeff"), how + ["start with a byte-order mark"]
    if body.endswith(","):
        body, how = body[:-1].rstrip(), how + ["end with a comma after the object"]
    if not how:
        return None, None
    try:
        return json.loads(body), " and ".join(how)
    except json.JSONDecodeError:
        return None, None


class _LazyStarts:
    """The line each element of a (valid) JSON array starts on, found by one scan on first use.
    The array is the whole text (from offset `at`), or the value of `key` in the top-level object."""

    def __init__(self, text: str, at: int | None, key: str | None = None):
        self._text, self._at, self._key = text, at, key
        self._starts: list[int] | None = None

    def __getitem__(self, index: int) -> int:
        if self._starts is None:
            at = self._at if self._at is not None else _value_offset(self._text, self._key or "")
            self._starts = _array_starts(self._text, at)
        return self._starts[index]


def _value_offset(text: str, key: str) -> int:
    """Where the value of `key` starts in the top-level JSON object of `text`."""
    decoder = json.JSONDecoder()
    at = _SPACE.match(text, 0).end() + 1  # past the "{"
    while True:
        at = _SPACE.match(text, at).end()
        name, at = decoder.raw_decode(text, at)
        at = _SPACE.match(text, at).end() + 1  # past the ":"
        at = _SPACE.match(text, at).end()
        if name == key:
            return at
        _, at = decoder.raw_decode(text, at)
        at = _SPACE.match(text, at).end() + 1  # past the ","


def _array_starts(text: str, at: int) -> list[int]:
    decoder = json.JSONDecoder()
    line = text.count("\n", 0, at) + 1
    at += 1  # past the "["
    starts, counted = [], at
    while True:
        at = _SPACE.match(text, at).end()
        if at >= len(text) or text[at] == "]":
            return starts
        line += text.count("\n", counted, at)
        counted = at
        starts.append(line)
        _, at = decoder.raw_decode(text, at)
        at = _SPACE.match(text, at).end()
        if at < len(text) and text[at] == ",":
            at += 1
