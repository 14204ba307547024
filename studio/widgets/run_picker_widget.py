"""RunPickerWidget: a combo of the finished runs (newest first), for the pages that use a trained model.

The folders are the truth: the list is rebuilt from the run folders on `refresh()`. `preferred`
(the Runs page's selection, given by the app) wins when it names a finished run. `run_changed`
fires only when the chosen run changes, so a page keeps its results across a refresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from backend.api.paths import runs_dir
from backend.api.runs import RunFolder


def finished_runs(root: Path | None = None) -> list[RunFolder]:
    """Run folders whose fine-tune finished, newest first (folder names start with the time)."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    children = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)
    return [RunFolder(p) for p in children if RunFolder(p).status() == "finished"]


class RunPickerWidget(QWidget):
    """"Run: [combo] [Refresh]"; emits `run_changed` with the chosen folder's path ("" for none)."""

    run_changed = Signal(str)
    """Emitted with the chosen run folder's path ("" when there is no finished run)."""

    def __init__(self, preferred: Callable[[], str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.preferred: Callable[[], str] = preferred or (lambda: "")
        """The run to pick when the list is refreshed (the Runs page's selection)."""
        self._emitted: str | None = None
        self.combo = QComboBox()
        self.combo.setMinimumWidth(320)
        self.combo.setPlaceholderText("No finished run yet: train one first")
        self.combo.currentIndexChanged.connect(self._on_combo_current_index_changed)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Run"))
        layout.addWidget(self.combo, 1)
        layout.addWidget(self.refresh_button)

    def refresh(self) -> None:
        """Re-read the finished runs; keep the preferred run, else the current one, else the newest."""
        current = self.preferred() or self.path()
        self.combo.blockSignals(True)
        self.combo.clear()
        for folder in finished_runs():
            self.combo.addItem(folder.run_id, str(folder.path))
        index = self.combo.findData(current) if current else -1
        self.combo.setCurrentIndex(index if index >= 0 else (0 if self.combo.count() else -1))
        self.combo.blockSignals(False)
        self._emit()

    def path(self) -> str:
        data = self.combo.currentData()
        return str(data) if data else ""

    def folder(self) -> RunFolder | None:
        return RunFolder(self.path()) if self.path() else None

    def _on_combo_current_index_changed(self, _index: int) -> None:
        self._emit()

    def _emit(self) -> None:
        if self.path() != self._emitted:
            self._emitted = self.path()
            self.run_changed.emit(self.path())
