"""discard_edits: asked before another file replaces a draft the person edited (a preset, File > Open config).

No question when there is nothing to lose: the draft as loaded, saved, or as the window restored it.
"""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

from studio.state.config_state import ConfigState


def discard_edits(parent: QWidget, state: ConfigState, replacement: str) -> bool:
    """Whether to go on replacing the draft with `replacement` (e.g. "the preset tiny_dpo"): True without
    a question when the draft holds no edits, else the person's Discard (Cancel keeps the draft)."""
    if not state.edited():
        return True
    buttons = QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel
    answer = QMessageBox.question(parent, "Discard your edits?",
                                  f"The setup has edits that are not saved to a config file. Starting over from "
                                  f"{replacement} discards them (File > Save config keeps them first).",
                                  buttons, QMessageBox.StandardButton.Cancel)
    return answer == QMessageBox.StandardButton.Discard
