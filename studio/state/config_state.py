"""ConfigState: the run configuration the pages are editing, as the plain dict a YAML file holds.

Pages change one dotted key at a time (`technique.lora_rank`); views listen to `changed` with that
key. Validation happens only when a RunConfig is asked for, so a half-typed value never fights the
person: the error is shown, naming the field, and Start refuses until it is fixed.

It also knows where it came from (the preset file) and what differs from it, which gives the
`finetune-studio train PRESET --set key=value ...` line that reproduces the window's setup.
"""

from __future__ import annotations

import copy
import os
import shlex
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from backend.config import ConfigError, RunConfig


def flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"seq_len": 8}} -> {"train.seq_len": 8}; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def yaml_scalar(value: Any) -> str:
    """A value as the CLI's `--set key=value` parses it back (YAML scalars)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(yaml_scalar(v) for v in value) + "]"
    return str(value)


def display_file(path: Path) -> str:
    """A path relative to the working folder when it is inside it (what a person would type)."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)


class ConfigState(QObject):
    """The draft RunConfig: dotted keys in, a validated RunConfig (or one error sentence) out."""

    changed = Signal(str)
    """Emitted with the dotted key that changed ("" when everything was replaced)."""

    def __init__(self, base: dict[str, Any] | None = None, source: Path | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._base = copy.deepcopy(base if base is not None else RunConfig().model_dump(mode="json"))
        self._raw = copy.deepcopy(self._base)
        self.source = source
        """The preset or saved file the draft started from (None: the built-in defaults)."""

    # --- reading ----------------------------------------------------------------------------
    def get(self, key: str) -> Any:
        node: Any = self._raw
        for part in key.split("."):
            node = node[part]
        return node

    def raw(self) -> dict[str, Any]:
        return copy.deepcopy(self._raw)

    def config(self) -> RunConfig:
        """The validated RunConfig; raises ConfigError naming the field and the fix."""
        raw = self.raw()
        train = raw.get("train", {})
        if train.get("warmup_steps", 0) and train.get("warmup_steps", 0) >= train.get("max_steps", 1):
            train["warmup_steps"] = 0  # a preset's warmup cannot outlast a short run
        return RunConfig.from_dict(raw, source="form")

    def problem(self) -> str:
        """Why the draft cannot run, in one line ("" when it can)."""
        try:
            self.config()
        except ConfigError as exc:
            return str(exc)
        return ""

    def overrides(self) -> list[str]:
        """`key=value` for every key that differs from the file the draft started from."""
        base, now = flatten(self._base), flatten(self._raw)
        return [f"{key}={yaml_scalar(value)}" for key, value in now.items() if base.get(key) != value]

    def command_line(self) -> str:
        """The CLI line that runs exactly this setup."""
        parts = ["finetune-studio", "train"]
        if self.source is not None:
            parts.append(display_file(self.source))
        for item in self.overrides():
            parts += ["--set", item]
        return " ".join(shlex.quote(part) for part in parts)

    # --- writing ----------------------------------------------------------------------------
    def set(self, key: str, value: Any) -> None:
        """Change one value (no validation here; see problem())."""
        *path, last = key.split(".")
        node = self._raw
        for part in path:
            node = node.setdefault(part, {})
        if node.get(last, object()) == value and type(node.get(last)) is type(value):
            return
        node[last] = value
        self.changed.emit(key)

    def replace(self, raw: dict[str, Any], source: Path | None = None) -> None:
        """Start over from another file's contents (a loaded or saved config)."""
        self._base = copy.deepcopy(raw)
        self._raw = copy.deepcopy(raw)
        self.source = source
        self.changed.emit("")

    def save(self, path: Path) -> RunConfig:
        """Validate and write the draft as YAML; the saved file becomes the command line's base."""
        config = self.config()
        config.save(path)
        self._base = config.model_dump(mode="json")
        self._raw = copy.deepcopy(self._base)
        self.source = Path(path)
        self.changed.emit("")
        return config


def diff_configs(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every key whose values differ, in a's order."""
    flat_a, flat_b = flatten(a), flatten(b)
    keys = list(flat_a) + [k for k in flat_b if k not in flat_a]
    missing = object()
    rows = []
    for key in keys:
        va, vb = flat_a.get(key, missing), flat_b.get(key, missing)
        if va != vb:
            rows.append((key, None if va is missing else va, None if vb is missing else vb))
    return rows
