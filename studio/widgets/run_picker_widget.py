"""RunPickerWidget: a combo of the finished runs (newest first), for the pages that use a trained model.

The folders are the truth: the list is rebuilt from the run folders on `refresh()`. A picker follows
the newest finished run until the person picks one (in the combo; the Runs page's selection before the
picker showed a run; a message sent on the Chat page); from then on it stays on that run, new runs or not, until that run is
deleted, when it follows the newest again. `run_changed` fires only when the chosen run changes, so a
page keeps its results (an export report, an evaluation) across a refresh.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from backend.core.paths import runs_dir
from backend.core.runs.run_continuation import ORIGIN, checkpoint_step
from backend.core.runs.run_folder import RunFolder, RunSummary

_SUMMARIES: dict[str, tuple[tuple[int, int], RunSummary, str]] = {}
"""Each run folder's summary and mark with the events stamp they were read at: a page shown again reads
no file twice."""
STATUS_WORDS = {"incomplete": "interrupted"}
"""A run without a last word, as a label says it (the window that trained it is gone, or it still runs)."""


def summary_of(folder: RunFolder) -> RunSummary:
    """The folder's summary, read again only when its events.jsonl changed."""
    return _read(folder)[1]


def mark_of(folder: RunFolder) -> str:
    """"continued from step 60" for a "train more" run, "resumed" for a run resumed in place, else ""."""
    return _read(folder)[2]


def _read(folder: RunFolder) -> tuple[tuple[int, int], RunSummary, str]:
    try:
        info = folder.events_path.stat()
        stamp = (info.st_mtime_ns, info.st_size)
    except OSError:
        stamp = (0, -1)
    cached = _SUMMARIES.get(str(folder.path))
    if cached is None or cached[0] != stamp:
        cached = _SUMMARIES[str(folder.path)] = (stamp, folder.summary(), _mark(folder))
    return cached


def _mark(folder: RunFolder) -> str:
    try:
        origin = json.loads((folder.path / ORIGIN).read_text(encoding="utf-8"))
        return f"continued from step {origin.get('step', '?')}"
    except (OSError, ValueError, AttributeError):
        pass
    resumed = any(e.get("type") == "JobStarted" and e.get("job", "finetune") == "finetune" and e.get("resumed_from")
                  for e in folder.iter_events())
    return "resumed" if resumed else ""


def finished_runs(root: Path | None = None) -> list[RunSummary]:
    """Summaries of the run folders whose fine-tune finished, newest first (as the Runs page orders them)."""
    root = root or runs_dir()
    if not root.is_dir():
        return []
    summaries = [summary_of(RunFolder(p)) for p in root.iterdir() if p.is_dir()]
    summaries.sort(key=lambda s: (s.created, s.run_id), reverse=True)
    return [s for s in summaries if s.status == "finished"]


def when_text(created: float, now: float | None = None) -> str:
    """"16:42:07" today, "2026-12-04 16:42:07" before: the seconds tell two runs of one minute apart."""
    day = time.strftime("%Y-%m-%d", time.localtime(now if now is not None else time.time()))
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created))
    return stamp[11:] if stamp.startswith(day) else stamp


def run_label(summary: RunSummary, mark: str = "") -> str:
    """A run on one line: "tiny-lora · lora · 60 steps · finished · 16:42:07 [· resumed]"."""
    status = STATUS_WORDS.get(summary.status, summary.status)
    parts = (summary.name, summary.method, f"{summary.steps:,} steps", status, when_text(summary.created), mark)
    return " · ".join(part for part in parts if part)


def run_labels(summaries: list[RunSummary]) -> list[str]:
    """Each run's label; where two would be equal (same name, same second) the folder's short id follows."""
    labels = [run_label(summary, mark_of(RunFolder(summary.path))) for summary in summaries]
    return [f"{label} · {summary.run_id[-4:]}" if labels.count(label) > 1 else label
            for summary, label in zip(summaries, labels)]


def resume_words(folder: RunFolder) -> tuple[str, str]:
    """A Resume button's text and tooltip naming the run: "Resume NAME (step K)", or "Train NAME more…" for a
    finished run; ("", "") when it has no complete checkpoint. The Train page's and the Runs page's say the same."""
    checkpoint = folder.latest_checkpoint()
    if checkpoint is None:
        return "", ""
    summary = summary_of(folder)
    name = summary.name if len(summary.name) <= 24 else summary.name[:23] + "…"
    shown = f"{run_label(summary, mark_of(folder))} ({folder.run_id})"
    if summary.status == "finished":
        return (f"Train {name} more…", f"{shown} has finished: train it for more steps as a new run from its "
                                      f"{checkpoint.name} (the finished run is kept as it is)")
    return (f"Resume {name} (step {checkpoint_step(checkpoint)})",
            f"Continue {shown} from {checkpoint.name}, its newest complete checkpoint")


class RunPickerWidget(QWidget):
    """"Run: [combo] [Refresh]"; emits `run_changed` with the chosen folder's path ("" for none)."""

    run_changed = Signal(str)
    """Emitted with the chosen run folder's path ("" when there is no finished run)."""

    def __init__(self, preferred: Callable[[], str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.preferred: Callable[[], str] = preferred or (lambda: "")
        """The run to show first, before this picker has shown one (the Runs page's selection)."""
        self.picked = ""
        """The run the person picked ("" while the picker follows the newest run)."""
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
        """Re-read the finished runs; show the picked run while it exists, else the newest."""
        if not self.picked and self._emitted is None:
            self.picked = self.preferred()  # the Runs page's selection is a pick of the person's
        self.combo.blockSignals(True)
        self.combo.clear()
        runs = finished_runs()
        for summary, label in zip(runs, run_labels(runs)):
            mark = mark_of(RunFolder(summary.path))
            self.combo.addItem(label, summary.path)
            tip = f"{summary.model}\n{summary.path}" + (f"\n{mark}: {_origin(summary.path)}" if mark else "")
            self.combo.setItemData(self.combo.count() - 1, tip, 3)  # ToolTipRole
        index = self.combo.findData(self.picked) if self.picked else -1
        if index < 0:
            self.picked = ""  # deleted, or never picked: follow the newest
        self.combo.setCurrentIndex(index if index >= 0 else (0 if self.combo.count() else -1))
        self.combo.blockSignals(False)
        self.combo.setToolTip(str(self.combo.currentData(3) or ""))
        self._emit()

    def choose(self, path: str) -> bool:
        """Pick this run (False when it is not a finished run in the list)."""
        index = self.combo.findData(path)
        if index >= 0:
            self.combo.setCurrentIndex(index)
            self.picked = path
        return index >= 0

    def path(self) -> str:
        data = self.combo.currentData()
        return str(data) if data else ""

    def folder(self) -> RunFolder | None:
        return RunFolder(self.path()) if self.path() else None

    def _on_combo_current_index_changed(self, _index: int) -> None:
        """A change outside refresh() (whose signals are blocked) is the person's pick."""
        self.picked = self.path()
        self.combo.setToolTip(str(self.combo.currentData(3) or ""))
        self._emit()

    def _emit(self) -> None:
        if self.path() != self._emitted:
            self._emitted = self.path()
            self.run_changed.emit(self.path())


def _origin(path: str) -> str:
    """Which run a continuation or a resumed run goes on from, as its origin.json or folder says."""
    try:
        return str(json.loads((Path(path) / ORIGIN).read_text(encoding="utf-8")).get("continues", ""))
    except (OSError, ValueError, AttributeError):
        return "this folder's own checkpoint"
