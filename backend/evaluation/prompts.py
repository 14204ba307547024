"""Held-out prompts with expected answers, for exact match and for the samples shown while training.

A prompts file is JSONL (or JSON) of {"prompt", "expected"} records, or of training-format records
(alpaca, sharegpt, messages) whose last assistant turn is the expected answer. With no file given,
a run trained on `<name>train<...>` uses `<name>eval<...>` beside it when one exists: the bundled
demo set (demo_train.jsonl) comes with its held-out demo_eval.jsonl. A file given by hand may be the
training data itself, or share prompts with it: `training_overlap` marks those, so the report never
calls a trained-on prompt held out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError, bad_input
from backend.core.data.conversation import InvalidExample, part_text
from backend.core.data.examples import DatasetReader
from backend.core.data.record_files import read_parts
from backend.core.data.records import Message, detect_format, to_conversation


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
        messages = [{"role": "user", "content": _text(record, "prompt", where)}]
        if record.get("system"):
            messages.insert(0, {"role": "system", "content": _text(record, "system", where)})
        return HeldOutPrompt(messages, _text(record, "expected", where))
    messages = to_conversation(record, fmt, where)
    if not messages or messages[-1]["role"] != "assistant" or len(messages) < 2:
        raise bad_input(f"{where}: the record must end with an assistant answer to compare against")
    return HeldOutPrompt(messages[:-1], messages[-1]["content"])


def _text(record: dict[str, Any], key: str, where: str) -> str:
    """A prompt record's field as text: never the words "None" or a list's repr."""
    fix = 'each record needs a "prompt" and an "expected" answer, both text'
    if key not in record:
        raise bad_input(f"{where}: a prompt record needs both 'prompt' and 'expected' (no {key!r})", fix)
    value = record[key]
    if isinstance(value, list) and value and all(isinstance(part, dict) for part in value):
        try:
            value = part_text(value)  # OpenAI content parts
        except InvalidExample as exc:
            raise bad_input(f"{where}: {key!r} has {exc.problem}", fix) from None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise bad_input(f"{where}: {key!r} is null", fix)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad_input(f"{where}: {key!r} is {type(value).__name__}, not text", fix)
    text = str(value)
    if not text.strip():
        raise bad_input(f"{where}: {key!r} is empty", fix)
    return text


def read_prompts(path: Path, limit: int | None = None) -> list[HeldOutPrompt]:
    """Prompt records -> HeldOutPrompt list (the first `limit` only), refusing what cannot be scored."""
    located = [(record, f"{part.path} {part.locate(i)}") for part in read_parts(path)
               for i, record in enumerate(part.rows)]
    if limit:
        located = located[:limit]
    records = [record for record, _ in located]
    if "prompt" in records[0]:
        fmt = "prompt"
    else:
        fmt = detect_format(records, path)
        if fmt == "text":
            raise bad_input(f"{path}: text records have no expected answer to compare against",
                            'use {"prompt": ..., "expected": ...} or alpaca records')
    return [_from_record(record, fmt, where) for record, where in located]


@dataclass(frozen=True)
class Overlap:
    """Which prompts the training data holds too: their scores measure recall, not held-out skill."""

    flags: list[bool]
    same_file: bool
    """The prompts file is data.path itself (or lies in the data.path folder)."""

    @property
    def count(self) -> int:
        return sum(self.flags)

    def sentence(self) -> str:
        """One line for the report and the CLI; "" when no prompt is in the training data."""
        if not self.count:
            return ""
        itself = " (the prompts file is the training data itself)" if self.same_file else ""
        return (f"{self.count} of {len(self.flags)} prompts are also in the training data{itself}, "
                "so their exact match is not held out")


def _key(messages: list[Message]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return " ".join((users[-1] if users else "").split()).casefold()


def training_overlap(prompts: list[HeldOutPrompt], config: RunConfig, prompts_file: Path) -> Overlap:
    """Mark the prompts whose last user turn (spaces and case aside) is a user turn of the training data."""
    data = config.resolved_data_path()
    try:
        same = prompts_file.resolve() == data.resolve() or (data.is_dir() and data.resolve() in
                                                              prompts_file.resolve().parents)
        reader = DatasetReader(data, config.data.format, skip_invalid=True, limit=config.data.max_examples)
        seen = {_key([m]) for example in reader.examples() for m in example.messages if m["role"] == "user"}
    except (JobError, OSError):  # training would have refused this data before; nothing to compare with
        return Overlap([False] * len(prompts), False)
    return Overlap([_key(p.messages) in seen for p in prompts], same)
