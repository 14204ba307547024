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

from backend.core.data.layouts import Layout

Message = dict[str, str]
MISSING = object()
IMAGE_MARKER = "<image>"
"""Where an image sits in a message's text (LLaMA-Factory's placeholder; image parts become it)."""
IMAGE_PARTS = ("image_url", "image", "input_image")


class InvalidExample(Exception):
    """An example training cannot use; `problem` completes "N examples have ..." (examples with the
    same problem are counted together), `detail` names this one's culprit (an image's path), `fix`
    says what to do when the general advice (fix the data or skip it) is not enough."""

    def __init__(self, problem: str, detail: str = "", fix: str = ""):
        super().__init__(problem)
        self.problem = problem
        self.detail = detail
        self.fix = fix


def convert(record: dict[str, Any], layout: Layout, images: list[Any] | None = None) -> list[Message]:
    """`images`, when given, collects the sources of image content parts in order (see part_text)."""
    if not isinstance(record, dict):
        raise InvalidExample(f"a record that is not an object ({type(record).__name__})")
    if layout.kind == "alpaca":
        return _alpaca(record, layout)
    if layout.kind == "sharegpt":
        return _sharegpt(record, layout, images)
    column = layout.prompt or "text"
    return [{"role": "text", "content": _required(record.get(column, MISSING), column)}]


def _alpaca(record: dict[str, Any], layout: Layout) -> list[Message]:
    get = record.get
    messages = _system(record, layout)
    if layout.history:
        for turn in _list(get(layout.history), layout.history):
            if not isinstance(turn, (list, tuple)) or len(turn) != 2:
                raise InvalidExample(f"a {layout.history} turn that is not a [prompt, answer] pair")
            prompt, answer = (_optional(value, layout.history) for value in turn)
            if not _filled(prompt) or not _filled(answer):
                raise InvalidExample(f"an empty or null turn in {layout.history}")
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    instruction = get(layout.prompt, MISSING) if layout.prompt else None
    if instruction is MISSING:
        raise InvalidExample(f"no {layout.prompt!r} field")
    instruction = _optional(instruction, layout.prompt)
    query = _optional(get(layout.query), layout.query) if layout.query else None
    # As in LLaMA-Factory, the user turn is the instruction and the input, whichever are filled.
    if _filled(instruction):
        prompt = f"{instruction}\n\n{query}" if _filled(query) else instruction
    elif _filled(query):
        prompt = query
    else:
        raise InvalidExample(f"an empty or null {layout.prompt or layout.query}")
    column = layout.response or "output"
    messages += [{"role": "user", "content": prompt},
                 {"role": "assistant", "content": _required(get(column, MISSING), column)}]
    return messages


def _system(record: dict[str, Any], layout: Layout) -> list[Message]:
    """The system column and the tool descriptions, as one leading system message."""
    system = _optional(record.get(layout.system), layout.system) if layout.system else None
    tools = _tools(record.get(layout.tools)) if layout.tools else None
    if tools:
        system = (system + "\n\n" if system else "") + f"You can call these tools:\n{tools}"
    return [{"role": "system", "content": system}] if _filled(system) else []


def _sharegpt(record: dict[str, Any], layout: Layout, images: list[Any] | None) -> list[Message]:
    column = layout.messages or "conversations"
    value = record.get(column, MISSING)
    if value is MISSING:
        raise InvalidExample(f"no {column!r} field")
    turns = _list(value, column)
    if not turns:
        raise InvalidExample(f"an empty or null {column}")
    messages = _system(record, layout)
    for turn in turns:
        if not isinstance(turn, dict):
            raise InvalidExample(f"a turn in {column} that is not an object")
        tag = turn.get(layout.role_tag)
        role = layout.role_of(tag)
        if role is None:
            known = f" (known: {', '.join(dict(layout.roles))})" if layout.roles else ""
            raise InvalidExample(f"a turn with the unknown role {tag!r}{known}" if tag is not None
                                 else f"a turn without {layout.role_tag!r}")
        content = _content(turn, layout.content_tag, role, images)
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


def _content(turn: dict[str, Any], tag: str, role: str, images: list[Any] | None) -> str | None:
    content = turn.get(tag)
    if content is None and role == "assistant" and turn.get("tool_calls"):
        calls = turn["tool_calls"]  # OpenAI: the call replaces the text
        return json.dumps([c.get("function", c) if isinstance(c, dict) else c for c in calls], ensure_ascii=False)
    if isinstance(content, list):
        return part_text(content, images)
    if isinstance(content, dict) and ("type" in content or "text" in content):
        return part_text([content], images)  # one part, not in a list
    return _optional(content, tag)


def part_text(parts: list[Any], images: list[Any] | None = None) -> str:
    """OpenAI content parts -> their text (one part a line). An image part becomes IMAGE_MARKER and
    its source (None for a bare {"type": "image"} placeholder) goes to `images`; without that list
    (a text-only reader) a picture is refused, as is a sound or a video."""
    texts: list[str] = []
    glue = False  # a marker and the text after it join without a newline, as LLaMA-Factory writes them
    for part in parts:
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if isinstance(part, str) or kind in ("text", "input_text", "output_text"):
            text = part if isinstance(part, str) else part.get("text")
            if text is not None:
                text = _optional(text, "text")
                if glue and texts:
                    texts[-1] += text
                else:
                    texts.append(text)
                glue = False
        elif kind in IMAGE_PARTS and images is not None:
            images.append(_image_source(part, kind))
            if glue and texts:
                texts[-1] += IMAGE_MARKER
            else:
                texts.append(IMAGE_MARKER)
            glue = True
        else:
            kind = kind or type(part).__name__
            raise InvalidExample(f"{kind} content (the studio trains on text only)")
    return "\n".join(texts)


def _image_source(part: dict[str, Any], kind: str) -> Any:
    """{"image_url": {"url": ...}}, {"image_url": "..."}, {"image": PATH}; None for a placeholder."""
    value = part.get(kind if kind != "input_image" else "image_url")
    if isinstance(value, dict):
        value = value.get("url")
    return value


def _required(value: Any, column: str) -> str:
    if value is MISSING:
        raise InvalidExample(f"no {column!r} field")
    text = _optional(value, column)
    if not _filled(text):
        raise InvalidExample(f"an empty or null {column}")
    return text


def _optional(value: Any, column: str | None) -> str | None:
    """Text, or None for a null (or absent) value."""
    if type(value) is str:
        return value
    if value is None or value is MISSING or (isinstance(value, float) and math.isnan(value)):
        return None  # NaN: what pandas writes for a missing cell
    if isinstance(value, (bool, int, float)):
        return str(value)
    raise InvalidExample(f"{_article(column or 'value')} {column} that is not text")


def _tools(value: Any) -> str | None:
    if value is MISSING or value is None or value in ("", [], {}):
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _list(value: Any, column: str) -> list[Any]:
    """A list field; JSON text (a CSV cell) is parsed; null, absent or empty: []."""
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InvalidExample(f"a {column} that is not a JSON list") from None
    if value is None or value is MISSING:
        return []
    if not isinstance(value, (list, tuple)):
        raise InvalidExample(f"a {column} that is not a list")
    return list(value)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _filled(text: str | None) -> bool:
    return bool(text) and not text.isspace()
