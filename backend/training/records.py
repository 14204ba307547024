"""Reading dataset files into conversations, with errors that name the file and line.

Formats, detected from the first records when `data.format` is `auto`:
- alpaca:   {instruction, input?, output, system?, history?}
- sharegpt: {conversations: [{from, value}], system?, tools?}  (LLaMA-Factory's roles included:
            human, gpt, function_call, observation)
- messages: {messages: [{role, content}]}
- text:     {text} records, or a plain .txt file (one document per blank-line-separated block)

Torch-free and stdlib-only: the studio's Data page can use the same reader for its preview.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from backend.errors import bad_input

Message = dict[str, str]
READABLE = (".jsonl", ".json", ".txt")
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool",
}


def read_records(path: Path) -> list[dict[str, Any]]:
    """JSON array, JSONL, or text file -> list of dicts (text files become {"text": block})."""
    if not path.exists():
        raise bad_input(f"{path}: dataset file not found", "pick an existing .jsonl, .json or .txt file")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in READABLE
                       and not p.name.startswith("."))
        if not files:
            raise bad_input(f"{path}: the folder holds nothing readable (no .jsonl, .json or .txt file)",
                            "point data.path at a dataset file, or put one in the folder")
        return [record for file in files for record in read_records(file)]
    raw = path.read_bytes()
    if b"\x00" in raw[:4096]:
        raise bad_input(f"{path}: looks like a binary file, not text", "pick a .jsonl, .json or .txt dataset")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise bad_input(f"{path} line {line}: not UTF-8 text", "re-save the file as UTF-8") from None
    if path.suffix.lower() == ".txt":
        blocks = [b.strip() for b in text.split("\n\n")]
        records: list[dict[str, Any]] = [{"text": b} for b in blocks if b]
    elif text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise bad_input(f"{path} line {exc.lineno}: not valid JSON ({exc.msg})") from None
        records = data
    else:
        records = list(_read_jsonl(path, text))
    if not records:
        raise bad_input(f"{path}: the dataset is empty", "add at least one example")
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise bad_input(f"{path} record {index + 1}: expected a JSON object, got {type(record).__name__}")
    return records


def _read_jsonl(path: Path, text: str) -> Iterable[dict[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise bad_input(
                f"{path} line {number}: not valid JSON ({exc.msg} at column {exc.colno})",
                "fix or delete that line; each line must be one JSON object",
            ) from None


def detect_format(records: list[dict[str, Any]], path: Path) -> str:
    keys = set(records[0])
    if "conversations" in keys:
        return "sharegpt"
    if "messages" in keys:
        return "messages"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    if "text" in keys:
        return "text"
    raise bad_input(
        f"{path}: cannot tell the format from the fields {sorted(keys)}",
        "use alpaca {instruction, input, output}, sharegpt {conversations}, messages, or {text}; "
        "or set data.format",
    )


def to_conversation(record: dict[str, Any], fmt: str, where: str) -> list[Message]:
    """One record -> chat messages ([{role, content}]); text records -> one 'text' message."""
    try:
        if fmt == "alpaca":
            return _alpaca(record)
        if fmt == "sharegpt":
            return _sharegpt(record)
        if fmt == "messages":
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in record["messages"]]
        if fmt == "text":
            return [{"role": "text", "content": str(record["text"])}]
    except KeyError as exc:
        raise bad_input(f"{where}: missing field {exc.args[0]!r} needed by the {fmt} format") from None
    except (TypeError, AttributeError):
        raise bad_input(f"{where}: fields have the wrong shape for the {fmt} format") from None
    raise bad_input(f"unknown data.format {fmt!r}")


def _alpaca(record: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    if record.get("system"):
        messages.append({"role": "system", "content": str(record["system"])})
    for turn in record.get("history") or []:
        messages += [{"role": "user", "content": str(turn[0])}, {"role": "assistant", "content": str(turn[1])}]
    prompt = str(record["instruction"])
    if record.get("input"):
        prompt = f"{prompt}\n\n{record['input']}"
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": str(record["output"])}]
    return messages


def _sharegpt(record: dict[str, Any]) -> list[Message]:
    messages: list[Message] = []
    system = str(record.get("system") or "")
    if record.get("tools"):
        system = (system + "\n\n" if system else "") + f"You can call these tools:\n{record['tools']}"
    if system:
        messages.append({"role": "system", "content": system})
    for turn in record["conversations"]:
        role = SHAREGPT_ROLES.get(str(turn["from"]))
        if role is None:
            raise KeyError(f"from={turn['from']}")
        messages.append({"role": role, "content": str(turn["value"])})
    return messages
