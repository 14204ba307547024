"""Layout: which fields of a record hold the prompt, the answer and the turns.

The built-in formats (alpaca, sharegpt, messages, text) are four layouts; an entry of a LLaMA-Factory
`dataset_info.json` beside the data is another (its `formatting`, `columns` and `tags`, read by the
rules of LLaMA-Factory's data/README.md and parser.py), so every record converts through one path
(backend.core.data.conversation). Torch-free and stdlib-only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

from backend.core.errors import bad_input

INFO_NAME = "dataset_info.json"
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool",
}


@dataclass(frozen=True)
class Layout:
    """Where one record keeps its parts; a field left None is not read."""

    kind: Literal["alpaca", "sharegpt", "text"]
    label: str
    """What the person sees as the format: `alpaca`, or `sharegpt (dataset_info.json: glaive)`."""
    prompt: str | None = None
    query: str | None = None
    response: str | None = None
    history: str | None = None
    system: str | None = None
    tools: str | None = None
    messages: str | None = None
    role_tag: str = "from"
    content_tag: str = "value"
    roles: tuple[tuple[str, str], ...] | None = None
    """Role-tag value -> chat role (user, assistant, system, tool); None passes the value through."""
    images: str | None = None
    """The field listing the row's images (LLaMA-Factory's `images` column; backend.core.data.image_records)."""

    @cached_property
    def _role_map(self) -> dict[str, str] | None:
        return None if self.roles is None else dict(self.roles)

    def role_of(self, tag: Any) -> str | None:
        if not isinstance(tag, str) or not tag:
            return None
        return tag if self._role_map is None else self._role_map.get(tag)


BUILTIN = {
    "alpaca": Layout("alpaca", "alpaca", prompt="instruction", query="input", response="output",
                     history="history", system="system"),
    "sharegpt": Layout("sharegpt", "sharegpt", messages="conversations", system="system", tools="tools",
                       roles=tuple(SHAREGPT_ROLES.items())),
    "messages": Layout("sharegpt", "messages", messages="messages", role_tag="role", content_tag="content",
                       roles=tuple({**SHAREGPT_ROLES, "developer": "system", "function": "tool",
                                    "ipython": "ipython"}.items())),
    "text": Layout("text", "text", prompt="text"),
}


def detect_format(records: Sequence[dict[str, Any]], path: Path) -> str:
    """The built-in format of the first record's fields; preference data is refused here."""
    keys = set(records[0])
    if {"chosen", "rejected"} <= keys:
        raise bad_input(
            f"{path}: the records hold 'chosen' and 'rejected' answers: that is preference data, "
            "which supervised fine-tuning cannot train on",
            "set technique.objective: dpo to train on the pairs (fields prompt, chosen, rejected), or "
            "technique.objective: kto, or use a dataset with one answer per prompt",
        )
    if _labelled(records[0], keys):
        raise bad_input(
            f"{path}: the records hold answers labelled good or bad ({'kto_tag' if 'kto_tag' in keys else 'label'}): "
            "that is KTO data, and supervised fine-tuning would learn the bad answers too",
            "set technique.objective: kto to train on the labelled answers, or use a dataset with one good "
            "answer per prompt",
        )
    if "conversations" in keys:
        return "sharegpt"
    if "messages" in keys:
        return "messages"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    if "text" in keys:
        return "text"
    table = path.is_dir() or path.suffix.lower() in (".csv", ".parquet", ".arrow")
    what = "columns" if table else "fields"
    raise bad_input(
        f"{path}: cannot tell the format from the {what} {sorted(keys)}; expected the {what} instruction and "
        "output (alpaca), conversations (sharegpt), messages, or text",
        _mapping_hint(keys, path) or "rename them, or set data.format, or describe the file in a LLaMA-Factory "
        "dataset_info.json beside it",
    )


def _labelled(record: dict[str, Any], keys: set[str]) -> bool:
    """KTO's shapes: prompt/completion/label, or turns with a kto_tag or a true/false label."""
    if "kto_tag" in keys or {"completion", "label"} <= keys:
        return True
    return bool(keys & {"messages", "conversations"}) and isinstance(record.get("label"), bool)


_PROMPTS = ("instruction", "question", "prompt", "query", "input", "problem", "human")
_ANSWERS = ("output", "answer", "response", "completion", "target", "solution", "assistant")


def _mapping_hint(keys: set[str], path: Path) -> str:
    """For a question/answer pair under other names: the dataset_info.json entry that reads it."""
    prompt = next((k for k in _PROMPTS if k in keys), None)
    answer = next((k for k in _ANSWERS if k in keys), None)
    if prompt is None or answer is None:
        return ""
    entry = {path.stem: {"file_name": path.name, "columns": {"prompt": prompt, "response": answer}}}
    return (f"rename {prompt!r} to 'instruction' and {answer!r} to 'output', or put a {INFO_NAME} beside it "
            f"holding {json.dumps(entry)}")


def entry_layout(path: Path, folder: Path | None = None) -> Layout | None:
    """The layout that a LLaMA-Factory dataset_info.json gives `path`: its own entry in the
    dataset_info.json beside it, else (for a file inside the folder data.path names) the folder's
    entry in the one beside the folder. None when neither describes it."""
    for info, target in ((path.parent / INFO_NAME, path), *(((folder.parent / INFO_NAME, folder),) if folder else ())):
        for name, entry in info_entries(info).items():
            file_name = entry.get("file_name")
            if any(key in entry for key in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")):
                continue  # LLaMA-Factory loads those from a hub or script, not from file_name
            if isinstance(file_name, str) and same_file(info.parent / file_name, target):
                return _layout(info, name, entry)
    return None


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def info_entries(info: Path) -> dict[str, dict[str, Any]]:
    try:
        stamp = info.stat().st_mtime_ns
    except OSError:
        return {}
    return _read_entries(str(info), stamp)


@lru_cache(maxsize=16)
def _read_entries(info: str, stamp: int) -> dict[str, dict[str, Any]]:
    """LLaMA-Factory's entries; {} for a `datasets` save_to_disk dataset_info.json (same name)."""
    try:
        data = json.loads(Path(info).read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise bad_input(f"{info} line {exc.lineno}: not valid JSON ({exc.msg})",
                        "fix the dataset descriptions, or move the file away from the data") from None
    except (OSError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or "features" in data or "splits" in data:
        return {}
    return {name: entry for name, entry in data.items() if isinstance(entry, dict)}


def _layout(info: Path, name: str, entry: dict[str, Any]) -> Layout:
    where = f"{info} entry {name!r}"
    columns = entry.get("columns")
    if columns is not None and not isinstance(columns, dict):
        raise bad_input(f"{where}: 'columns' must be an object mapping roles to field names")
    mapped = columns or {}
    if entry.get("ranking") or "chosen" in mapped or "rejected" in mapped:
        raise bad_input(f"{where}: this is preference data (ranking, chosen/rejected answers), which supervised "
                        "fine-tuning cannot train on", "pick an SFT dataset, or set technique.objective: dpo (it "
                        "reads this dataset_info.json entry's columns)")
    if "kto_tag" in mapped:
        raise bad_input(f"{where}: this is KTO feedback data (kto_tag: answers marked good or bad), which "
                        "supervised fine-tuning would learn the bad answers from", "pick an SFT dataset, or set "
                        "technique.objective: kto (it reads this dataset_info.json entry's columns)")
    media = [key for key in ("videos", "audios") if key in mapped]
    if media:
        raise bad_input(f"{where}: this dataset has {', '.join(media)}; the studio trains on text and images only",
                        "pick a dataset of text, or of text and images")
    formatting = entry.get("formatting", "alpaca")
    if formatting == "alpaca":
        return _alpaca(name, columns)
    if formatting == "sharegpt":
        return sharegpt_layout(name, columns, entry.get("tags"), where)
    raise bad_input(f"{where}: unknown formatting {formatting!r}", "use alpaca or sharegpt")


def _alpaca(name: str, columns: dict[str, Any] | None) -> Layout:
    # LLaMA-Factory's defaults apply only without "columns"; with it, an unnamed column is not read.
    if columns is None:
        return Layout("alpaca", f"alpaca (dataset_info.json: {name})", prompt="instruction", query="input",
                      response="output")
    get = {key: value for key, value in columns.items() if isinstance(value, str)}.get
    if get("response") is None and get("prompt"):  # a pre-training entry: {"prompt": "text"}
        return Layout("text", f"text (dataset_info.json: {name})", prompt=get("prompt"), images=get("images"))
    return Layout("alpaca", f"alpaca (dataset_info.json: {name})", prompt=get("prompt"), query=get("query"),
                  response=get("response"), history=get("history"), system=get("system"), tools=get("tools"),
                  images=get("images"))


def sharegpt_layout(name: str, columns: dict[str, Any] | None, tags: Any, where: str) -> Layout:
    get = {key: value for key, value in (columns or {}).items() if isinstance(value, str)}.get
    defaults = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
    if tags is not None:
        if not isinstance(tags, dict):
            raise bad_input(f"{where}: 'tags' must be an object (role_tag, content_tag, user_tag, ...)")
        # As in LLaMA-Factory, "tags" replaces the defaults: a role tag it leaves out is not accepted.
        defaults = {key: tags.get(key) for key in defaults} | {
            "role_tag": tags.get("role_tag") or "from", "content_tag": tags.get("content_tag") or "value"}
    roles = tuple((defaults[tag], role) for tag, role in (
        ("user_tag", "user"), ("assistant_tag", "assistant"), ("observation_tag", "tool"),
        ("function_tag", "assistant"), ("system_tag", "system")) if isinstance(defaults[tag], str))
    return Layout("sharegpt", f"sharegpt (dataset_info.json: {name})",
                  messages=get("messages") or "conversations",
                  system=get("system"), tools=get("tools"), role_tag=defaults["role_tag"],
                  content_tag=defaults["content_tag"], roles=roles, images=get("images"))
