"""MainWindow: the form, the live chart, the readouts and the log. Layout only, no logic.

The window shows state and reports what the person asked for (`start_requested`,
`stop_requested`); studio/app.py decides what happens. Closing consults `close_guard`, which the
app sets, so a close during a run can be turned into "stop, save, then close".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from backend.config import TechniqueSection, TrainSection
from backend.paths import resolve_resource
from studio.state.form_values import FormValues, config_path, display_path

if TYPE_CHECKING:  # pyqtgraph + numpy cost ~0.3 s: the chart module is imported after the first paint
    from studio.widgets.loss_chart import LossChart

LOG_MAX_LINES = 5000
"""The log pane keeps only the newest lines, so a chatty worker cannot grow the studio's memory."""


def _field_range(model: type, name: str, default_max: int) -> tuple[int, int, str]:
    """(minimum, maximum, tooltip) of an int config field, from its constraints and docstring."""
    info = model.model_fields[name]  # type: ignore[attr-defined]
    low, high = 1, default_max
    for item in info.metadata:
        low = getattr(item, "ge", None) if getattr(item, "ge", None) is not None else low
        high = getattr(item, "le", None) if getattr(item, "le", None) is not None else high
    return int(low), int(high), info.description or ""


class MainWindow(QMainWindow):
    """One screen: choose model and data, set rank and steps, start, watch the loss fall."""

    start_requested = Signal()
    """Emitted when the person pressed Start (button or Ctrl+Return)."""
    stop_requested = Signal()
    """Emitted when the person pressed Stop (button or Ctrl+.)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Finetune Studio")
        self.resize(1100, 720)
        self.close_guard: Callable[[], bool] | None = None
        """Called on close; returning False keeps the window open."""
        self.chart: LossChart | None = None
        """The loss chart, once `set_chart` put it in place of the placeholder."""
        self._chart_slot: QWidget = QLabel("Loading the chart…")
        self._chart_slot.setAlignment(Qt.AlignmentFlag.AlignCenter)

        self.model_edit, model_row = self._path_row("Browse…", self._on_model_browse_clicked)
        self.data_edit, data_row = self._path_row("Browse…", self._on_data_browse_clicked)
        self.model_edit.setToolTip("A local Hugging Face model folder, or the bundled tiny model.")
        self.data_edit.setToolTip("A JSONL or JSON file of examples, or the bundled demo dataset.")
        self.rank_spin = self._spin(TechniqueSection, "lora_rank", 1024)
        self.steps_spin = self._spin(TrainSection, "max_steps", 10_000_000)

        self.start_action = QAction("Start", self, shortcut=QKeySequence("Ctrl+Return"))
        self.start_action.setToolTip("Start training (Ctrl+Return)")
        self.start_action.triggered.connect(self.start_requested)
        self.stop_action = QAction("Stop", self, shortcut=QKeySequence("Ctrl+."))
        self.stop_action.setToolTip("Stop at the next step and save a checkpoint (Ctrl+.)")
        self.stop_action.triggered.connect(self.stop_requested)
        self.addAction(self.start_action)
        self.addAction(self.stop_action)
        self.start_button = QPushButton("Start")
        self.start_button.setToolTip(self.start_action.toolTip())
        self.start_button.clicked.connect(self.start_action.trigger)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip(self.stop_action.toolTip())
        self.stop_button.clicked.connect(self.stop_action.trigger)

        self.tokens_label = QLabel("— tokens/s")
        self.tokens_label.setToolTip("Non-padding tokens trained per second")
        self.progress = QProgressBar()
        self.progress.setFormat("step %v / %m")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.log_view = QPlainTextEdit()
        self.log_view.setReadOnly(True)
        self.log_view.setMaximumBlockCount(LOG_MAX_LINES)
        self.log_view.setPlaceholderText("Phases, checkpoints, errors and the worker's log appear here.")

        self._layout(model_row, data_row)
        self.set_running(False)

    # --- building -----------------------------------------------------------------------------
    def _layout(self, model_row: QWidget, data_row: QWidget) -> None:
        form = QFormLayout()
        form.addRow("Model", model_row)
        form.addRow("Dataset", data_row)
        form.addRow("LoRA rank", self.rank_spin)
        form.addRow("Max steps", self.steps_spin)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        setup = QGroupBox("Run")
        setup_layout = QVBoxLayout(setup)
        setup_layout.addLayout(form)
        setup_layout.addLayout(buttons)

        readouts = QHBoxLayout()
        readouts.addWidget(self.progress, 1)
        readouts.addWidget(self.tokens_label)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.addWidget(setup)
        top_layout.addWidget(self._chart_slot, 1)
        self._top_layout = top_layout
        top_layout.addLayout(readouts)
        top_layout.addWidget(self.status_label)

        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(top)
        splitter.addWidget(self.log_view)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        self.setCentralWidget(splitter)

    def _path_row(self, label: str, on_browse: Callable[[], None]) -> tuple[QLineEdit, QWidget]:
        edit = QLineEdit()
        button = QPushButton(label)
        button.clicked.connect(on_browse)
        row = QWidget()
        layout = QHBoxLayout(row)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(edit, 1)
        layout.addWidget(button)
        return edit, row

    def _spin(self, section: type, name: str, default_max: int) -> QSpinBox:
        low, high, tip = _field_range(section, name, default_max)
        spin = QSpinBox()
        spin.setRange(low, high)
        spin.setToolTip(tip)
        spin.setAccelerated(True)
        spin.setMaximumWidth(160)
        return spin

    def set_chart(self, chart: LossChart) -> None:
        """Put the chart where the placeholder is (the app builds it after the first paint)."""
        self._top_layout.replaceWidget(self._chart_slot, chart)
        self._chart_slot.deleteLater()
        self._chart_slot = chart
        self.chart = chart

    # --- form -----------------------------------------------------------------------------------
    def form_values(self) -> FormValues:
        return FormValues(
            model_path=config_path(self.model_edit.text()),
            data_path=config_path(self.data_edit.text()),
            lora_rank=self.rank_spin.value(),
            max_steps=self.steps_spin.value(),
        )

    def set_form_values(self, values: FormValues) -> None:
        self.model_edit.setText(display_path(values.model_path))
        self.data_edit.setText(display_path(values.data_path))
        self.rank_spin.setValue(values.lora_rank)
        self.steps_spin.setValue(values.max_steps)

    def _on_model_browse_clicked(self) -> None:
        start = _existing(resolve_resource(config_path(self.model_edit.text())))
        folder = QFileDialog.getExistingDirectory(self, "Choose a model folder", start)
        if folder:
            self.model_edit.setText(folder)

    def _on_data_browse_clicked(self) -> None:
        start = _existing(resolve_resource(config_path(self.data_edit.text())))
        path, _ = QFileDialog.getOpenFileName(self, "Choose a dataset", start,
                                              "Datasets (*.jsonl *.json);;All files (*)")
        if path:
            self.data_edit.setText(path)

    # --- readouts -------------------------------------------------------------------------------
    def set_running(self, running: bool) -> None:
        for widget in (self.model_edit, self.data_edit, self.rank_spin, self.steps_spin):
            widget.setEnabled(not running)
        self.start_action.setEnabled(not running)
        self.start_button.setEnabled(not running)
        self.stop_action.setEnabled(running)
        self.stop_button.setEnabled(running)

    def set_status(self, text: str, details: str = "") -> None:
        """One sentence on the status line; `details` (a crash report) shows as its tooltip."""
        self.status_label.setText(text)
        self.status_label.setToolTip(details)

    def set_progress(self, step: int, max_steps: int) -> None:
        self.progress.setRange(0, max(max_steps, 1))
        self.progress.setValue(min(step, max(max_steps, 1)))

    def set_tokens_per_s(self, value: float | None) -> None:
        self.tokens_label.setText("— tokens/s" if value is None else f"{value:,.0f} tokens/s")

    def append_log(self, line: str) -> None:
        self.log_view.appendPlainText(line)

    def log_text(self) -> str:
        return self.log_view.toPlainText()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        if self.close_guard is not None and not self.close_guard():
            event.ignore()
            return
        super().closeEvent(event)


def _existing(path: Path) -> str:
    """The nearest existing folder at or above `path`, so a file dialog opens somewhere real."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return str(candidate)
    return ""
