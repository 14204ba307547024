"""FormValues: what the main window's form holds, and how bundled paths read to a person.

Config files say `bundled:tiny`; a person should read "Bundled tiny model". The window shows the
label, and `config_path()` turns it (or a typed path) back into what the config stores, so the
GUI saves exactly the file the CLI reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.paths import BUNDLED_PREFIX

BUNDLED_LABELS = {
    "bundled:tiny": "Bundled tiny model",
    "bundled:datasets/demo_train.jsonl": "Bundled demo dataset (demo_train.jsonl)",
}
"""Readable names of the resources shipped with the studio."""


@dataclass(frozen=True)
class FormValues:
    """The form's choices, in config terms (paths as the config stores them)."""

    model_path: str
    data_path: str
    lora_rank: int
    max_steps: int


def display_path(value: str) -> str:
    """`bundled:tiny` -> "Bundled tiny model"; other paths unchanged."""
    if value in BUNDLED_LABELS:
        return BUNDLED_LABELS[value]
    if value.startswith(BUNDLED_PREFIX):
        return f"Bundled: {value[len(BUNDLED_PREFIX):]}"
    return value


def config_path(text: str) -> str:
    """Inverse of display_path: a label back to `bundled:...`, anything else as typed (trimmed)."""
    text = text.strip()
    for value, label in BUNDLED_LABELS.items():
        if text == label:
            return value
    if text.startswith("Bundled: "):
        return BUNDLED_PREFIX + text[len("Bundled: "):]
    return text
