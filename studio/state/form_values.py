"""How bundled paths read to a person, and back.

Config files say `bundled:tiny`; a person should read "Bundled tiny model". The pages show the
label, and `config_path()` turns it (or a typed path) back into what the config stores, so the
GUI saves exactly the file the CLI reads.
"""

from __future__ import annotations

from backend.core.paths import BUNDLED_PREFIX

BUNDLED_LABELS = {
    "bundled:tiny": "Bundled tiny model",
    "bundled:datasets/demo_train.jsonl": "Bundled demo dataset (demo_train.jsonl)",
}
"""Readable names of the resources shipped with the studio."""


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
