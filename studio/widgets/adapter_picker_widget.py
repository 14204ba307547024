"""AdapterPickerWidget: model.adapter, the earlier run's adapter a new run keeps training (SFT, then DPO or GRPO).

The usual path past supervised tuning starts from the SFT run's adapter. The combo offers the
finished runs that wrote an adapter (newest first), or Browse picks any adapter folder. The choice is
checked torch-free by the worker's own check (start_adapter_folder: it exists, is a LoRA/DoRA adapter,
its rank, alpha and method match technique's), and what is wrong is shown in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import ValidationError
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from backend.core.config.run_config import ConfigError, ModelSection, RunConfig, TechniqueSection
from backend.core.errors import JobError
from backend.core.paths import resolve_resource
from backend.api.run_index import RunIndex
from backend.core.runs.run_folder import RunFolder
from backend.core.runs.start_adapter import start_adapter_folder
from studio.state.config_state import ConfigState
from studio.state.form_values import display_path
from studio.widgets.field_editors import description
from studio.widgets.run_picker_widget import run_labels

KEY = "model.adapter"
CHECKED_KEYS = ("", KEY, "model.path", "technique.method", "technique.lora_rank", "technique.lora_alpha")
"""Keys whose change can make the start adapter fit or stop fitting."""
NONE_TEXT = "None: train a new adapter"


def adapter_runs(index: RunIndex) -> list[tuple[str, str]]:
    """(label, run folder) of the finished runs that wrote an adapter, newest first (from the run index,
    which re-reads only the folders that changed)."""
    found = [s for s in index.sync() if s.status == "finished"
             and (RunFolder(s.path).adapter_dir / "adapter_config.json").is_file()]
    found.sort(key=lambda s: (s.created, s.run_id), reverse=True)
    return list(zip(run_labels(found), (s.path for s in found)))  # named as the other pickers name runs


def adapter_problem(state: ConfigState) -> str:
    """Why the draft's model.adapter cannot start this run, in one line ("" when it can, or none is set)."""
    if not state.get(KEY):
        return ""
    try:
        config = state.config()
    except ConfigError:  # another field is wrong: still check the adapter against the technique as typed
        raw = state.raw()
        try:
            technique = TechniqueSection.model_validate(raw.get("technique", {}))
        except ValidationError:
            technique = TechniqueSection()
        config = RunConfig.model_construct(model=ModelSection.model_construct(**raw.get("model", {})),
                                           technique=technique)
    try:
        start_adapter_folder(config)
    except JobError as exc:
        return exc.message + (f"; {exc.hint}" if exc.hint else "")
    return ""


class AdapterPickerWidget(QWidget):
    """"Start adapter: [combo] [Browse…]" and the one-line check under it."""

    def __init__(self, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._state = state
        self._showing = False
        self._index: RunIndex | None = None
        self.ask_folder: Callable[[], str] = self._ask_folder
        """Asks for an adapter folder; tests replace it to skip the dialog."""
        self.combo = QComboBox()
        self.combo.setToolTip(description(KEY))
        self.combo.setMinimumWidth(280)
        self.combo.currentIndexChanged.connect(self._on_combo_current_index_changed)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.setToolTip("Choose an adapter folder (holding adapter_config.json) or a run folder")
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.combo, 1)
        row.addWidget(self.browse_button)
        self.problem_label = QLabel()
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet("color: #dc2626;")
        self.problem_label.setVisible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.problem_label)
        state.changed.connect(self._on_state_changed)
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the list from the run folders (once shown), keeping the draft's choice shown."""
        current = self._state.get(KEY) or ""
        self._showing = True
        try:
            self.combo.clear()
            self.combo.addItem(NONE_TEXT, "")
            for label, path in adapter_runs(self._index) if self._index is not None else []:
                self.combo.addItem(f"Run {label}", path)
            index = self._index_of(current)
            if current and index < 0:
                self.combo.addItem(f"Folder: {display_path(current)}", current)
                index = self.combo.count() - 1
            self.combo.setCurrentIndex(max(index, 0))
        finally:
            self._showing = False
        self._check()

    def _index_of(self, value: str) -> int:
        if not value:
            return 0
        wanted = resolve_resource(value)
        for index in range(1, self.combo.count()):
            data = self.combo.itemData(index)
            if data and (data == value or resolve_resource(data) in (wanted, wanted.parent)):
                return index
        return -1

    def choose(self, path: str) -> None:
        """Start from this adapter (a run folder or an adapter folder; "" for a new adapter)."""
        self._state.set(KEY, path)

    def problem(self) -> str:
        return self.problem_label.text()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        if self._index is None:  # the run list is read once shown, never before the window's first paint
            self._index = RunIndex()
        self.refresh()  # a run may have finished since

    def _on_combo_current_index_changed(self, index: int) -> None:
        if not self._showing and index >= 0:
            self.choose(str(self.combo.itemData(index) or ""))

    def _on_browse_button_clicked(self) -> None:
        folder = self.ask_folder()
        if folder:
            self.choose(folder)

    def _ask_folder(self) -> str:
        start = resolve_resource(self._state.get(KEY)) if self._state.get(KEY) else Path.home()
        return QFileDialog.getExistingDirectory(self, "Choose the adapter to start from", str(start))

    def _on_state_changed(self, key: str) -> None:
        if key in ("", KEY):
            self.refresh()
        elif key in CHECKED_KEYS:
            self._check()

    def _check(self) -> None:
        problem = adapter_problem(self._state)
        self.problem_label.setText(problem)
        self.problem_label.setVisible(bool(problem))
