"""Reading dataset files into conversations, with errors that name the file and line.

Files: JSON (an array), JSONL, .txt (one document per blank-line-separated block), CSV, Parquet,
Arrow, a `datasets.save_to_disk` folder, or a folder of such files (backend.core.data.record_files).
Formats, detected from the first record when `data.format` is `auto` (backend.core.data.layouts):
- alpaca:   {instruction, input?, output, system?, history?}
- sharegpt: {conversations: [{from, value}], system?, tools?}  (LLaMA-Factory's roles included:
            human, gpt, function_call, observation)
- messages: {messages: [{role, content}]}  (content may be OpenAI-style parts)
- text:     {text} records, or a plain .txt file
A LLaMA-Factory dataset_info.json beside the data maps other field names onto these.
Training reads through backend.core.data.examples.DatasetReader, which also counts and refuses (or
skips) examples with a null or empty prompt or answer; these functions serve one-record callers.

Torch-free: the studio's Data page uses the same reader for its preview (`datasets` is imported
only for CSV, Parquet and Arrow data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.core.errors import bad_input
from backend.core.data.conversation import InvalidExample, Message, convert
from backend.core.data.layouts import BUILTIN, SHAREGPT_ROLES, detect_format
from backend.core.data.record_files import READABLE, read_parts

__all__ = ["Message", "READABLE", "SHAREGPT_ROLES", "detect_format", "read_records", "to_conversation"]


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a file or folder as a dict, in order (a .txt block becomes {"text": block})."""
    return [record for part in read_parts(path) for record in part.rows]


def to_conversation(record: dict[str, Any], fmt: str, where: str) -> list[Message]:
    """One record -> chat messages ([{role, content}]); text records -> one 'text' message."""
    layout = BUILTIN.get(fmt)
    if layout is None:
        raise bad_input(f"unknown data.format {fmt!r}", f"use one of {', '.join(BUILTIN)}")
    try:
        return convert(record, layout)
    except InvalidExample as exc:
        raise bad_input(f"{where}: the example has {exc.problem} ({fmt} format)") from None
