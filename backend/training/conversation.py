"""One record -> chat messages ([{role, content}]) by its Layout, refusing what cannot be trained on.

A null or empty prompt, answer or turn raises InvalidExample instead of becoming the text "None":
the caller counts them and refuses the dataset or skips them (data.skip_invalid). Cells that hold
JSON text (a CSV's conversations or history column) are parsed; OpenAI-style content parts
([{"type": "text", "text": ...}]) are read as their text. Torch-free and stdlib-only.
"""

from __future__ import annotations

import json
import math
from typing import Any

from backend.training.layouts import Layout

Message = dict[str, str]
MISSING = object()


class InvalidExample(Exception):
    """An example training cannot use; `problem` completes "N examples have ..."."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


def convert(record: dict[str, Any], layout: Layout) -> list[Message]:
    if layout.kind == "alpaca":
        return _alpaca(record, layout)
    if layout.kind == "sharegpt":
        return _sharegpt(record, layout)
    return [{"role": "text", "content": _required(record, layout.prompt or "text")}]


def _alpaca(record: dict[str, Any], layout: Layout) -> list[Message]:
    messages: list[Message] = []
    system = _optional(record, layout.system)
    tools = _tools(record, layout.tools)
    if tools:
        system = (system + "\n\n" if system else "") + f"You can call these tools:\n{tools}"
    if system:
        messages.append({"role": "system", "content": system})
    for turn in _list(record, layout.history):
        if not isinstance(turn, (list, tuple)) or len(turn) != 2:
            raise InvalidExample(f"a {layout.history} turn that is not a [prompt, answer] pair")
        prompt, answer = (_text(value, layout.history) for value in turn)
        if not _filled(prompt) or not _filled(answer):
            raise InvalidExample(f"an empty or null turn in {layout.history}")
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    if layout.prompt and _value(record, layout.prompt) is MISSING:
        raise InvalidExample(f"no {layout.prompt!r} field")
    # As in LLaMA-Factory, the user turn is the instruction and the input, whichever are filled.
    parts = [part for part in (_optional(record, layout.prompt), _optional(record, layout.query)) if _filled(part)]
    if not parts:
        raise InvalidExample(f"an empty or null {layout.prompt or layout.query}")
    prompt = "\n\n".join(parts)
    answer = _required(record, layout.response or "output")
    return messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def _sharegpt(record: dict[str, Any], layout: Layout) -> list[Message]:
    column = layout.messages or "conversations"
    turns = _list(record, column, required=True)
    messages: list[Message] = []
    system = _optional(record, layout.system)
    tools = _tools(record, layout.tools)
    if tools:
        system = (system + "\n\n" if system else "") + f"You can call these tools:\n{tools}"
    if system:
        messages.append({"role": "system", "content": system})
    for turn in turns:
        if not isinstance(turn, dict):
            raise InvalidExample(f"a turn in {column} that is not an object")
        tag = turn.get(layout.role_tag)
        role = layout.role_of(tag)
        if role is None:
            raise InvalidExample(f"a turn with the unknown role {tag!r}" if tag is not None
                                 else f"a turn without {layout.role_tag!r}")
        content = _content(turn, layout.content_tag, role)
        if role == "system":
            if _filled(content):
                messages.append({"role": role, "content": content})
            continue
        if content is None or (role in ("user", "assistant") and not _filled(content)):
            article = "an" if role[0] in "aeiou" else "a"
            raise InvalidExample(f"{article} {role} turn with empty or null {layout.content_tag}")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise InvalidExample("no assistant turn")
    return messages


def _content(turn: dict[str, Any], tag: str, role: str) -> str | None:
    content = turn.get(tag)
    if content is None and role == "assistant" and turn.get("tool_calls"):
        calls = turn["tool_calls"]  # OpenAI: the call replaces the text
        return json.dumps([c.get("function", c) if isinstance(c, dict) else c for c in calls], ensure_ascii=False)
    if isinstance(content, list):
        return _parts(content)
    return None if _null(content) else _text(content, tag)


def _parts(parts: list[Any]) -> str:
    """OpenAI content parts -> their text (one part a line); a picture or sound is refused."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") in ("text", "input_text", "output_text"):
            if part.get("text") is not None:
                texts.append(_text(part["text"], "text"))
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidExample(f"{kind} content (the studio trains on text only)")
    return "\n".join(texts)


def _value(record: dict[str, Any], column: str) -> Any:
    return record.get(column, MISSING) if isinstance(record, dict) else MISSING


def _required(record: dict[str, Any], column: str) -> str:
    value = _value(record, column)
    if value is MISSING:
        raise InvalidExample(f"no {column!r} field")
    text = None if _null(value) else _text(value, column)
    if not _filled(text):
        raise InvalidExample(f"an empty or null {column}")
    return text


def _optional(record: dict[str, Any], column: str | None) -> str | None:
    if not column:
        return None
    value = _value(record, column)
    return None if value is MISSING or _null(value) else _text(value, column)


def _tools(record: dict[str, Any], column: str | None) -> str | None:
    value = _value(record, column) if column else None
    if value is MISSING or value in (None, "", [], {}):
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _list(record: dict[str, Any], column: str | None, required: bool = False) -> list[Any]:
    """A list field; JSON text (a CSV cell) is parsed. Optional and absent or empty: []."""
    value = _value(record, column) if column else None
    if value is MISSING and required:
        raise InvalidExample(f"no {column!r} field")
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InvalidExample(f"a {column} that is not a JSON list") from None
    if value is MISSING or value is None or value == "" or value == []:
        if required:
            raise InvalidExample(f"an empty or null {column}")
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidExample(f"a {column} that is not a list")
    return list(value)


def _text(value: Any, column: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return str(value)
    raise InvalidExample(f"a {column} that is not text")


def _null(value: Any) -> bool:
    """None, or the NaN that pandas writes for a missing cell."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _filled(text: str | None) -> bool:
    return text is not None and text.strip() != ""
