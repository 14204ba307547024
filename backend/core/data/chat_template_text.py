"""A model's chat template rendered without torch or transformers, for the Data page's previews.

The template is the model folder's chat_template.jinja, or tokenizer_config.json's chat_template (a
named list: the "default" one), rendered the way transformers renders it: a sandboxed jinja2
environment with trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `strftime_now` and
a `tojson` filter, and the tokenizer's bos/eos tokens as variables. What training sees still comes from
the tokenizer itself; this is what a person reads before starting.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Callable

Render = Callable[[list[dict[str, Any]], bool], str]


def _token(value: Any) -> str:
    return value.get("content", "") if isinstance(value, dict) else (value or "")


def template_renderer(model_dir: Path) -> Render | None:
    """render(messages, add_generation_prompt) for the model in `model_dir`; None without a template
    (or one that does not compile: the preview then shows the fields as they are)."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None
    config: dict[str, Any] = {}
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    source = None
    if (model_dir / "chat_template.jinja").is_file():
        source = (model_dir / "chat_template.jinja").read_text(encoding="utf-8")
    elif isinstance(config.get("chat_template"), str):
        source = config["chat_template"]
    elif isinstance(config.get("chat_template"), list):
        named = {t.get("name"): t.get("template") for t in config["chat_template"] if isinstance(t, dict)}
        source = named.get("default")
    if not source:
        return None

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
    try:
        template = env.from_string(source)
    except jinja2.exceptions.TemplateError:
        return None
    tokens = {name: _token(config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")}

    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens)
    return render


def special_tokens(model_dir: Path) -> tuple[str, ...]:
    """The tokenizer's special tokens as text (tokenizer.json's added tokens marked special, and
    tokenizer_config.json's named ones), longest first: what a preview leaves out of rendered text."""
    found: set[str] = set()
    try:
        added = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
        found |= {t["content"] for t in added if isinstance(t, dict) and t.get("special") and t.get("content")}
    except (OSError, ValueError, AttributeError):
        pass
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict):
        found |= {_token(config.get(n)) for n in ("bos_token", "eos_token", "pad_token", "unk_token")}
        for name in ("extra_special_tokens", "additional_special_tokens"):
            extra = config.get(name)
            found |= {_token(t) for t in (extra if isinstance(extra, list) else [])}
    return tuple(sorted((t for t in found if t), key=len, reverse=True))
