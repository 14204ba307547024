"""Held-out prompts with expected answers, for exact match and for the samples shown while training.

A prompts file is JSONL (or JSON) of {"prompt", "expected"} records, or of training-format records
(alpaca, sharegpt, messages) whose last assistant turn is the expected answer. With no file given,
a run trained on `<name>train<...>` uses `<name>eval<...>` beside it when one exists: the bundled
demo set (demo_train.jsonl) comes with its held-out demo_eval.jsonl.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.config import RunConfig
from backend.errors import bad_input
from backend.training.records import Message, detect_format, read_records, to_conversation


@dataclass(frozen=True)
class HeldOutPrompt:
    messages: list[Message]  # the conversation up to the answer (it ends with a user turn)
    expected: str

    @property
    def shown(self) -> str:
        """The last user turn, on one line: what a person reads as 'the prompt'."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return " ".join((users[-1] if users else "").split())


def default_prompts_file(config: RunConfig) -> Path | None:
    """The held-out file beside the training file (demo_train.jsonl -> demo_eval.jsonl), if any."""
    data = config.resolved_data_path()
    if not data.is_file() or "train" not in data.name:
        return None
    candidate = data.with_name(data.name.replace("train", "eval"))
    return candidate if candidate.is_file() and candidate != data else None


def _from_record(record: dict[str, Any], fmt: str, where: str) -> HeldOutPrompt:
    if fmt == "prompt":
        if "prompt" not in record or "expected" not in record:
            raise bad_input(f"{where}: a prompt record needs both 'prompt' and 'expected'")
        messages = [{"role": "user", "content": str(record["prompt"])}]
        if record.get("system"):
            messages.insert(0, {"role": "system", "content": str(record["system"])})
        return HeldOutPrompt(messages, str(record["expected"]))
    messages = to_conversation(record, fmt, where)
    if not messages or messages[-1]["role"] != "assistant" or len(messages) < 2:
        raise bad_input(f"{where}: the record must end with an assistant answer to compare against")
    return HeldOutPrompt(messages[:-1], messages[-1]["content"])


def read_prompts(path: Path, limit: int | None = None) -> list[HeldOutPrompt]:
    """Prompt records -> HeldOutPrompt list (the first `limit` only), refusing what cannot be scored."""
    records = read_records(path)
    if limit:
        records = records[:limit]
    if "prompt" in records[0]:
        fmt = "prompt"
    else:
        fmt = detect_format(records, path)
        if fmt == "text":
            raise bad_input(f"{path}: text records have no expected answer to compare against",
                            'use {"prompt": ..., "expected": ...} or alpaca records')
    return [_from_record(record, fmt, f"{path} record {i + 1}") for i, record in enumerate(records)]
