"""LLaMA-Factory's dataset_info.json for preference data: ranking pairs (DPO) and kto_tag feedback (KTO).

An entry with `ranking: true` (or chosen/rejected columns) or a `kto_tag` column describes where a
record keeps its parts; `entry_mapper` turns each record into the shape the objective readers take
(prompt as a message list, chosen/rejected or completion as assistant messages, label), following
LLaMA-Factory's data/README.md: alpaca ranking reads instruction + input, chosen and rejected;
sharegpt ranking reads the conversation and one chosen and one rejected message; kto reads a
conversation whose last message is the answer and the tag as its label. Torch-free, stdlib only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from backend.core.errors import bad_input
from backend.core.data.layouts import INFO_NAME, info_entries, same_file, sharegpt_layout

Mapper = Callable[[dict[str, Any]], dict[str, Any]]


def entry_mapper(path: Path, folder: Path | None = None) -> tuple[str, Mapper] | None:
    """(label, record -> canonical record) for the preference or KTO entry describing `path` in the
    dataset_info.json beside it (or beside `folder`); None when no such entry names it."""
    for info, target in ((path.parent / INFO_NAME, path), *(((folder.parent / INFO_NAME, folder),) if folder else ())):
        for name, entry in info_entries(info).items():
            file_name = entry.get("file_name")
            if isinstance(file_name, str) and same_file(info.parent / file_name, target):
                return _mapper(info, name, entry)
    return None


def is_preference_entry(entry: dict[str, Any]) -> bool:
    """Whether a dataset_info.json entry describes DPO pairs or KTO feedback rather than SFT data."""
    columns = entry.get("columns") if isinstance(entry.get("columns"), dict) else {}
    return bool(entry.get("ranking")) or "chosen" in columns or "rejected" in columns or "kto_tag" in columns


def _mapper(info: Path, name: str, entry: dict[str, Any]) -> tuple[str, Mapper] | None:
    if not is_preference_entry(entry):
        return None
    where = f"{info} entry {name!r}"
    columns = entry.get("columns") or {}
    if not isinstance(columns, dict):
        raise bad_input(f"{where}: 'columns' must be an object mapping roles to field names")
    get = {key: value for key, value in columns.items() if isinstance(value, str)}.get
    formatting = entry.get("formatting", "alpaca")
    kto = "kto_tag" in columns
    label = f"{formatting} {'kto' if kto else 'ranking'} (dataset_info.json: {name})"
    if formatting == "alpaca":
        return label, _alpaca(get, kto, defaults="columns" not in entry)
    if formatting == "sharegpt":
        return label, _conversation(sharegpt_layout(name, columns, entry.get("tags"), where), get, kto)
    raise bad_input(f"{where}: unknown formatting {formatting!r}", "use alpaca or sharegpt")


def _alpaca(get: Callable[[str], str | None], kto: bool, defaults: bool) -> Mapper:
    # As for SFT entries, LLaMA-Factory's default columns apply only to an entry without "columns".
    prompt, query, system = get("prompt") or "instruction", get("query") or ("input" if defaults else None), get("system")
    chosen, rejected = get("chosen") or "chosen", get("rejected") or "rejected"
    response, tag = get("response") or "output", get("kto_tag")

    def convert(record: dict[str, Any]) -> dict[str, Any]:
        text, extra = _text(record.get(prompt)), _text(record.get(query)) if query else ""
        turns = [{"role": "system", "content": record[system]}] if system and record.get(system) else []
        turns.append({"role": "user", "content": f"{text}\n{extra}" if text and extra else text or extra})
        if kto:
            return {"prompt": turns, "completion": [{"role": "assistant", "content": record.get(response)}],
                    "label": record.get(tag)}
        return {"prompt": turns, "chosen": [{"role": "assistant", "content": record.get(chosen)}],
                "rejected": [{"role": "assistant", "content": record.get(rejected)}]}
    return convert


def _conversation(layout: Any, get: Callable[[str], str | None], kto: bool) -> Mapper:
    chosen, rejected, tag = get("chosen") or "chosen", get("rejected") or "rejected", get("kto_tag")

    def message(raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            return {"role": "assistant", "content": raw}
        return {"role": layout.role_of(raw.get(layout.role_tag)), "content": raw.get(layout.content_tag)}

    def convert(record: dict[str, Any]) -> dict[str, Any]:
        raw_turns = record.get(layout.messages)
        turns = [message(turn) for turn in raw_turns] if isinstance(raw_turns, list) else raw_turns
        if layout.system and record.get(layout.system) and isinstance(turns, list):
            turns = [{"role": "system", "content": record[layout.system]}, *turns]
        if kto:  # the reader checks that the last turn is the assistant's answer
            return {"messages": turns, "label": record.get(tag)}
        return {"prompt": turns, "chosen": [message(record.get(chosen))], "rejected": [message(record.get(rejected))]}
    return convert


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
