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

from backend.core.config.run_config import ConfigError, RunConfig, yaml_scalar
from backend.core.config.schedule import TrainSection, alternative_to_clear, warmup_outlasts


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
    started_over = Signal()
    """Emitted when another file replaced the draft (a preset, File > Open config), not on a save."""

    def __init__(self, base: dict[str, Any] | None = None, source: Path | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._base = copy.deepcopy(base if base is not None else RunConfig().model_dump(mode="json"))
        self._raw = copy.deepcopy(self._base)
        self._clean = copy.deepcopy(self._base)
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
        try:
            return RunConfig.from_dict(self._as_run(), source="form")
        except ConfigError as exc:  # the window is the form: the sentence starts with the field, not "form:"
            text = str(exc)
            if not text.startswith("form: "):
                raise
            raise ConfigError(text[len("form: "):]) from None

    def _as_run(self) -> dict[str, Any]:
        """The draft as it runs: a warmup kept from the base file that outlasts a max_steps lowered
        in the window becomes 0 (a warmup the person typed is refused, as the CLI refuses it)."""
        raw = self.raw()
        train = raw.get("train")
        if isinstance(train, dict) and self.warmup_dropped(train):
            train["warmup_steps"] = 0
        return raw

    def warmup_dropped(self, train: dict[str, Any] | None = None) -> bool:
        """Whether the base file's warmup outlasts the draft's max_steps, so the run has none."""
        train = train if train is not None else self._raw.get("train", {})
        warmup = train.get("warmup_steps", TrainSection.model_fields["warmup_steps"].default)
        inherited = warmup == flatten(self._base).get("train.warmup_steps")
        return inherited and warmup_outlasts(warmup, train.get("max_steps", TrainSection().max_steps))

    def notes(self) -> list[str]:
        """What the window changed on its own to make the draft run, one sentence each."""
        if not self.warmup_dropped():
            return []
        return [f"train.warmup_steps {self.get('train.warmup_steps')} from the file outlasts train.max_steps "
                f"{self.get('train.max_steps')}: this run has no warmup (--set train.warmup_steps=0)"]

    def edited(self) -> bool:
        """Whether the person changed the draft since it was loaded, saved or marked clean: starting over
        from another file would lose those edits."""
        return flatten(self._raw) != flatten(self._clean)

    def problem(self) -> str:
        """Why the draft cannot run, in one line ("" when it can)."""
        try:
            self.config()
        except ConfigError as exc:
            return str(exc)
        return ""

    def overrides(self) -> list[str]:
        """`key=value` for every key that differs from the file the draft started from."""
        base, now = flatten(self._base), flatten(self._as_run())
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
        """Change one value (no validation here; see problem()). Setting one of two ways to say the same
        thing (num_epochs, max_steps) turns the other off first, as --set does on the command line, so no
        listener sees both."""
        if not self._put(key, value):
            return
        partner = alternative_to_clear(key, value)
        cleared = partner is not None and self._put(*partner)
        self.changed.emit(key)
        if cleared:
            self.changed.emit(partner[0])

    def _put(self, key: str, value: Any) -> bool:
        """Write one value into the draft; False when it already held it."""
        *path, last = key.split(".")
        node = self._raw
        for part in path:
            node = node.setdefault(part, {})
        if node.get(last, object()) == value and type(node.get(last)) is type(value):
            return False
        node[last] = value
        return True

    def replace(self, raw: dict[str, Any], source: Path | None = None) -> None:
        """Start over from another file's contents (a loaded or saved config)."""
        self._base = copy.deepcopy(raw)
        self._raw = copy.deepcopy(raw)
        self._clean = copy.deepcopy(raw)
        self.source = source
        self.changed.emit("")
        self.started_over.emit()

    def mark_clean(self) -> None:
        """What the draft holds now counts as no edit (the window's own restored choices at start)."""
        self._clean = copy.deepcopy(self._raw)

    def save(self, path: Path) -> RunConfig:
        """Validate and write the draft as YAML; the saved file becomes the command line's base."""
        config = self.config()
        config.save(path)
        self._base = config.model_dump(mode="json")
        self._raw = copy.deepcopy(self._base)
        self._clean = copy.deepcopy(self._base)
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
