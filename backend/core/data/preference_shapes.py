"""The shapes preference data comes in, normalised to the fields TRL's DPO and KTO trainers read.

Pairs (DPO, and KTO unpaired): prompt/chosen/rejected as text or as chat messages; LLaMA-Factory's
ranking format (`conversations` of {from, value} turns, or `messages` of {role, content}, with
`chosen` and `rejected` as one message each, or as text). Labelled answers (KTO): prompt/completion/
label as text or messages; LLaMA-Factory's KTO format (`messages` or `conversations` whose last turn
is the answer, with `label` or `kto_tag`). A pair comes out as {prompt, chosen, rejected}, a labelled
answer as {prompt, completion, label}: all text, or prompt a list of {role, content} messages and each
answer a list of assistant messages. A malformed record is refused in one line: file, line, field, fix.
Stdlib-only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from backend.core.errors import bad_input
from backend.core.data.layouts import SHAREGPT_ROLES
from backend.core.data.preference_info import entry_mapper
from backend.core.data.record_files import read_parts

PAIR_FIELDS = ("prompt", "chosen", "rejected")
TURN_FIELDS = ("conversations", "messages")
"""Where LLaMA-Factory (sharegpt, openai) keeps the turns when there is no `prompt` field."""
LABEL_FIELDS = ("label", "kto_tag")
TRUE_WORDS, FALSE_WORDS = ("true", "1"), ("false", "0")

Message = dict[str, str]
Content = str | list[Message]


def each_record(path: Path, limit: int | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) for every record of the data, where as `file line N`; stops after `limit`."""
    count = 0
    for part in read_parts(path):
        described = entry_mapper(part.path, path if path.is_dir() else None)  # a LLaMA-Factory dataset_info.json
        for index, record in enumerate(part.rows):
            if limit is not None and count >= limit:
                return
            count += 1
            yield f"{part.path} {part.locate(index)}", described[1](record) if described else record


def _shown(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _message(value: Any, where: str, name: str) -> Message:
    """One {role, content} or {from, value} turn as {role, content}; the roles as LLaMA-Factory names them."""
    if not isinstance(value, dict):
        raise bad_input(f"{where}: the field {name!r} holds a {_shown(value)} where a message belongs",
                        "write each message as {\"role\": ..., \"content\": ...} or {\"from\": ..., \"value\": ...}")
    role_key, content_key = ("role", "content") if "role" in value or "content" in value else ("from", "value")
    tag, content = value.get(role_key), value.get(content_key)
    role = SHAREGPT_ROLES.get(tag) if isinstance(tag, str) else None
    if role is None:
        raise bad_input(f"{where}: a message in {name!r} has the {role_key} {tag!r}, not one of "
                        "user, assistant, system (or human, gpt)", f"give every message in {name!r} a known {role_key}")
    if not isinstance(content, str):
        raise bad_input(f"{where}: a message in {name!r} has its {content_key} as {_shown(content)}, not text",
                        f"write each message's {content_key} as a string")
    return {"role": role, "content": content}


def _messages(value: Any, where: str, name: str) -> list[Message]:
    messages = [value] if isinstance(value, dict) else value
    if not isinstance(messages, list) or not messages:
        raise bad_input(f"{where}: the field {name!r} is {'empty' if messages == [] else _shown(value)}, "
                        "not text or chat messages", f"write {name!r} as text or as a list of messages")
    return [_message(m, where, name) for m in messages]


def _text(value: str, where: str, name: str) -> str:
    if not value.strip():
        raise bad_input(f"{where}: the field {name!r} is empty", "fill it in or remove the record")
    return value


def _prompt(value: Any, where: str, name: str) -> Content:
    """Text, or messages ending on the user's turn (the answer comes next)."""
    if isinstance(value, str):
        return _text(value, where, name)
    messages = _messages(value, where, name)
    if messages[-1]["role"] not in ("user", "tool"):
        raise bad_input(f"{where}: the last message of {name!r} is the {messages[-1]['role']}'s; the prompt must end "
                        "on the user's turn", f"end {name!r} with the user's message, the answer in its own field")
    if not messages[-1]["content"].strip():
        raise bad_input(f"{where}: the last message of {name!r} is empty", "fill it in or remove the record")
    return messages


def _answer(value: Any, where: str, name: str) -> Content:
    """Text, or assistant messages (one message dict or a list)."""
    if isinstance(value, str):
        return _text(value, where, name)
    if value is None or not isinstance(value, (dict, list)):
        raise bad_input(f"{where}: the field {name!r} is {_shown(value)}, not text or an assistant message",
                        f"write {name!r} as a string or as {{\"role\": \"assistant\", \"content\": ...}}")
    messages = _messages(value, where, name)
    others = [m["role"] for m in messages if m["role"] != "assistant"]
    if others:
        raise bad_input(f"{where}: the field {name!r} holds a {others[0]} message; an answer is the assistant's",
                        f"give {name!r} the assistant's role (from: gpt, or role: assistant)")
    if not "".join(m["content"] for m in messages).strip():
        raise bad_input(f"{where}: the field {name!r} is empty", "fill it in or remove the record")
    return messages


def _prompt_field(record: dict[str, Any]) -> str | None:
    return next((name for name in ("prompt", *TURN_FIELDS) if name in record), None)


def _to_chat(parts: dict[str, Content]) -> dict[str, Content]:
    """Every part as messages: a text prompt a user turn, a text answer an assistant turn."""
    return {k: ([{"role": "user" if k == "prompt" else "assistant", "content": v}] if isinstance(v, str) else v)
            for k, v in parts.items()}


def _as_chat(parts: dict[str, Content]) -> dict[str, Content]:
    """All text stays text; a record with any messages has every part as messages."""
    return parts if all(isinstance(v, str) for v in parts.values()) else _to_chat(parts)


def is_pair(record: dict[str, Any]) -> bool:
    return "chosen" in record and "rejected" in record


def normalise_pair(record: dict[str, Any], where: str) -> dict[str, Content]:
    """One preference pair, in any accepted shape, as {prompt, chosen, rejected}."""
    source = _prompt_field(record)
    missing = [n for n in ("prompt", "chosen", "rejected") if (source is None if n == "prompt" else n not in record)]
    if missing:
        raise bad_input(
            f"{where}: a preference pair needs the fields prompt (or conversations/messages), chosen and rejected; "
            f"this record has no {' and no '.join(repr(m) for m in missing)} "
            f"(its fields: {', '.join(sorted(map(str, record)))})",
            "give every record a prompt and the two answers, or set technique.objective: sft for instruction data")
    pair = _as_chat({"prompt": _prompt(record[source], where, source),
                     "chosen": _answer(record["chosen"], where, "chosen"),
                     "rejected": _answer(record["rejected"], where, "rejected")})
    if pair["chosen"] == pair["rejected"]:
        raise bad_input(f"{where}: 'chosen' and 'rejected' are the same answer: the pair teaches nothing",
                        "fix the pair or remove the record")
    return pair


def parse_label(value: Any, where: str, name: str) -> bool:
    """A KTO label: true/false, the strings "true"/"false" (or "1"/"0", as CSV gives them), or the numbers 1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise bad_input(f"{where}: the field {name!r} is {'null' if value is None else repr(value)}, not a label "
                    "(true or false, 1 or 0)",
                    f"write {name!r} as true for a good answer and false for a bad one")


def normalise_unpaired(record: dict[str, Any], where: str) -> dict[str, Any]:
    """One labelled answer, in any accepted shape, as {prompt, completion, label}."""
    label_field = next((name for name in LABEL_FIELDS if name in record), None)
    source = _prompt_field(record)
    if label_field is None or source is None or (source == "prompt" and "completion" not in record):
        missing = [n for n, absent in (("prompt", source is None), ("completion", source == "prompt" and
                                       "completion" not in record), ("label", label_field is None)) if absent]
        raise bad_input(
            f"{where}: a KTO example needs prompt, completion and label (or messages/conversations ending on the "
            f"answer, with label or kto_tag); this record has no {' and no '.join(repr(m) for m in missing)} "
            f"(its fields: {', '.join(sorted(map(str, record)))})",
            "give every record its prompt, one answer and a true/false label, or prompt/chosen/rejected pairs")
    label = parse_label(record[label_field], where, label_field)
    if source == "prompt":
        parts = {"prompt": _prompt(record["prompt"], where, "prompt"),
                 "completion": _answer(record["completion"], where, "completion")}
    else:
        turns = _messages(record[source], where, source)
        if turns[-1]["role"] != "assistant" or len(turns) < 2:
            raise bad_input(f"{where}: the last message of {source!r} must be the assistant's answer that "
                            f"{label_field!r} judges, after the user's turn",
                            f"end {source!r} with the answer (from: gpt, or role: assistant)")
        parts = {"prompt": _prompt(turns[:-1], where, source), "completion": _answer(turns[-1:], where, source)}
    return {**_as_chat(parts), "label": label}


def unpair(pair: dict[str, Content]) -> list[dict[str, Any]]:
    """A pair as two labelled answers: chosen desirable, rejected undesirable (TRL's unpair_preference_dataset)."""
    return [{"prompt": pair["prompt"], "completion": pair["chosen"], "label": True},
            {"prompt": pair["prompt"], "completion": pair["rejected"], "label": False}]


def read_pairs(path: Path, limit: int | None = None) -> list[dict[str, Content]]:
    """Every record as {prompt, chosen, rejected}, in order; the first malformed one refused with its line."""
    pairs = [normalise_pair(record, where) for where, record in each_record(path, limit)]
    if not pairs:
        raise bad_input(f"{path}: no preference pair to train on", "check data.path")
    return pairs


def read_unpaired(path: Path, limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Every record as labelled answers, a pair as two; -> (examples, number of pairs unpaired)."""
    examples: list[dict[str, Any]] = []
    pairs = 0
    for where, record in each_record(path, limit):
        if is_pair(record) and not any(name in record for name in LABEL_FIELDS):
            examples.extend(unpair(normalise_pair(record, where)))
            pairs += 1
        else:
            examples.append(normalise_unpaired(record, where))
    if not examples:
        raise bad_input(f"{path}: no labelled answer to train on", "check data.path")
    return examples, pairs


def as_trl_row(row: dict[str, Any], chat: bool, path: Path) -> dict[str, Any]:
    """A row as TRL reads it: text becomes turns where the model has a chat template; messages need one."""
    if chat:
        return _to_chat({k: v for k, v in row.items() if k != "label"}) | (
            {"label": row["label"]} if "label" in row else {})
    if any(isinstance(v, list) for v in row.values()):
        raise bad_input(f"{path}: the data holds chat messages, and this model's tokenizer has no chat template",
                        "write prompt and answers as text, or use a model whose tokenizer has a chat template")
    return dict(row)
