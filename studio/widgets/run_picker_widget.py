"""RunPickerWidget: a combo of the finished runs (newest first), for the pages that use a trained model.

The folders are the truth: the list is rebuilt from the run folders on `refresh()`. Each page keeps
its own choice across refreshes and visits to other pages; `preferred` (the Runs page's selection)
only seeds a picker that has shown no run yet. `run_changed` fires only when the chosen run changes,
so a page keeps its results (an export report, an evaluation) across a refresh.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from backend.core.paths import runs_dir
from backend.core.runs.run_folder import RunFolder, RunSummary


_SUMMARIES: dict[str, tuple[tuple[int, int], RunSummary]] = {}
"""Each run folder's summary with the events stamp it was read at: a page shown again reads no file twice."""


def summary_of(folder: RunFolder) -> RunSummary:
    """The folder's summary, read again only when its events.jsonl changed."""
    try:
        info = folder.events_path.stat()
        stamp = (info.st_mtime_ns, info.st_size)
    except OSError:
        stamp = (0, -1)
    cached = _SUMMARIES.get(str(folder.path))
    if cached is None or cached[0] != stamp:
        cached = _SUMMARIES[str(folder.path)] = (stamp, folder.summary())
    return cached[1]


def finished_runs(root: Path | None = None) -> list[RunSummary]:
    """Summaries of the run folders whose fine-tune finished, newest first (folder names start with the time)."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    children = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True)
    summaries = (summary_of(RunFolder(p)) for p in children)
    return [s for s in summaries if s.status == "finished"]


def run_label(summary: RunSummary) -> str:
    """What the Runs page shows of a run, on one line: "name · method · 2026-12-04 20:31"."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(summary.created))
    return " · ".join(part for part in (summary.name, summary.method, when) if part)


class RunPickerWidget(QWidget):
    """"Run: [combo] [Refresh]"; emits `run_changed` with the chosen folder's path ("" for none)."""

    run_changed = Signal(str)
    """Emitted with the chosen run folder's path ("" when there is no finished run)."""

    def __init__(self, preferred: Callable[[], str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.preferred: Callable[[], str] = preferred or (lambda: "")
        """The run to show first, before this picker has shown one (the Runs page's selection)."""
        self._emitted: str | None = None
        self.combo = QComboBox()
        self.combo.setMinimumWidth(320)
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
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
        """Re-read the finished runs; keep the run shown, else the preferred one, else the newest."""
        current = self.path() or self.preferred()
        self.combo.blockSignals(True)
        self.combo.clear()
        for summary in finished_runs():
            self.combo.addItem(run_label(summary), summary.path)
            self.combo.setItemData(self.combo.count() - 1, f"{summary.model}\n{summary.path}", 3)  # ToolTipRole
        index = self.combo.findData(current) if current else -1
        self.combo.setCurrentIndex(index if index >= 0 else (0 if self.combo.count() else -1))
        self.combo.blockSignals(False)
        self.combo.setToolTip(str(self.combo.currentData(3) or ""))
        self._emit()

    def choose(self, path: str) -> bool:
        """Show this run (False when it is not a finished run in the list)."""
        index = self.combo.findData(path)
        if index >= 0:
            self.combo.setCurrentIndex(index)
        return index >= 0

    def path(self) -> str:
        data = self.combo.currentData()
        return str(data) if data else ""

    def folder(self) -> RunFolder | None:
        return RunFolder(self.path()) if self.path() else None

    def _on_combo_current_index_changed(self, _index: int) -> None:
        self.combo.setToolTip(str(self.combo.currentData(3) or ""))
        self._emit()

    def _emit(self) -> None:
        if self.path() != self._emitted:
            self._emitted = self.path()
            self.run_changed.emit(self.path())
