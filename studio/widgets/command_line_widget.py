"""CommandLineWidget: the `finetune-studio train ...` line that reproduces the window's setup.

What the window can do, a server without a screen can do too: this line (the preset plus a
`--set` per changed field, or the saved config file) runs the same job headless. Copy puts it on
the clipboard; Save config writes the YAML the line then points to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from backend.core.config.run_config import ConfigError
from studio.state.config_state import ConfigState


TOOLTIP = "Runs this setup without the window (on a server, over ssh)."


class CommandLineWidget(QWidget):
    """A read-only line of shell, with Copy and Save config… buttons."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self.line_edit = QLineEdit()
        self.line_edit.setReadOnly(True)
        self.line_edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.line_edit.setToolTip(TOOLTIP)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the command line to the clipboard")
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.save_button = QPushButton("Save config…")
        self.save_button.setToolTip("Write this setup as a YAML config file that the CLI reads")
        self.save_button.clicked.connect(self._on_save_button_clicked)
        self.ask_save_path: Callable[[], str] = self._ask_save_path
        """Asks where to save; tests replace it to skip the file dialog."""
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Command line:"))
        layout.addWidget(self.line_edit, 1)
        layout.addWidget(self.copy_button)
        layout.addWidget(self.save_button)
        state.changed.connect(self._on_state_changed)
        self._on_state_changed("")

    def text(self) -> str:
        return self.line_edit.text()

    def _on_state_changed(self, key: str) -> None:
        self.line_edit.setText(self._state.command_line())
        self.line_edit.setCursorPosition(0)
        self.line_edit.setToolTip("\n".join([TOOLTIP, *self._state.notes()]))

    def _on_copy_button_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
        self.copy_button.setText("Copied")
        self.copy_button.setToolTip("Copied to the clipboard")

    def _ask_save_path(self) -> str:
        path, _ = QFileDialog.getSaveFileName(self, "Save the config", "run.yaml", "YAML config (*.yaml *.yml)")
        return path

    def _on_save_button_clicked(self) -> None:
        path = self.ask_save_path()
        if not path:
            return
        try:
            self._state.save(Path(path))
        except (ConfigError, OSError) as exc:
            self.line_edit.setToolTip(f"Not saved: {exc}")
            return
        self.copy_button.setText("Copy")
