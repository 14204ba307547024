"""ExportPage: step 6, turn a finished run into files another program loads, verified, and measure it.

Pick a finished run and a format (each says who loads it), the dtype for merged and bitsandbytes
exports, the output folder (RUN_DIR/exports/FORMAT unless changed) and whether to overwrite. Export
runs the export job in a fresh worker with a progress bar; the verification report is shown check
by check (a failed check in red). Beside it, Evaluate compares the base and the tuned model, and
Prune (a tab beside Evaluate, studio/widgets/prune_widget.py) ranks and removes layers, heads and channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from backend.core.registries.export_formats import (
    CALIBRATED,
    CALIBRATION_SAMPLES_DEFAULT,
    CALIBRATION_SAMPLES_MAX,
    DTYPES,
    EXPORT_FORMATS,
    EXPORT_REPORT,
    FORMATS,
    export_format,
    overwrite_refusal,
    vision_refusal,
)
from backend.core.config.run_config import ConfigError
from backend.core.runs.run_folder import RunFolder
from backend.core.registries.vision_families import VisionFamily
from backend.core.vision_folder import VisionFolder
from backend.core.protocol import MetricsLogged, PhaseChanged
from studio.job_controller import JobController, JobOutcome, failure_text
from studio.services.open_folder import open_folder
from studio.widgets.evaluation_widget import EvaluationWidget
from studio.widgets.export_report_widget import ExportReportWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.prune_widget import PruneWidget
from studio.widgets.run_picker_widget import RunPickerWidget
from studio.widgets.serve_widget import ServeWidget
from studio.widgets.vertical_scroll_area import VerticalScrollArea

REPORT = EXPORT_REPORT
DTYPE_FORMATS = tuple(f.name for f in EXPORT_FORMATS.values() if f.offers_dtype)
"""Formats whose written weights (or the merge before quantizing) take the dtype option (merged, bnb-*)."""


class ExportPage(QWidget):
    """Run picker, export options, Export with progress, the verification report, and Evaluate."""

    def __init__(self, jobs: JobController, eval_jobs: JobController, preferred_run: Callable[[], str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.confirm_overwrite: Callable[[Path], bool] = self._ask_overwrite
        """Asked before replacing an existing export folder; tests replace it."""
        self.open_url: Callable[[QUrl], object] = QDesktopServices.openUrl
        """Opens a folder in the file manager; tests replace it."""
        self._out_edited = False
        self._out: Path | None = None
        self._family: VisionFamily | None = None  # the chosen run's vision-language family (None: a text run)
        header = PageHeaderWidget("Export and evaluate", "Write a finished run in the format the program you "
                                  "serve it with loads; every export is loaded back and checked against the "
                                  "trained model. Evaluate compares the base and the tuned model.")
        self.picker = RunPickerWidget(preferred_run)
        self.picker.run_changed.connect(self._on_picker_run_changed)

        self.format_combo = QComboBox()
        for name, what in FORMATS.items():
            self.format_combo.addItem(name, name)
            self.format_combo.setItemData(self.format_combo.count() - 1, what, 3)  # ToolTipRole
        self.format_combo.currentIndexChanged.connect(self._on_format_combo_current_index_changed)
        self.format_help = QLabel()
        self.format_help.setWordWrap(True)
        self.format_help.setStyleSheet("color: palette(placeholder-text);")
        self.dtype_combo = QComboBox()
        self.dtype_combo.addItem("the base's own", None)  # as the CLI without --dtype: bf16 for an fp32 base
        for name in DTYPES:
            self.dtype_combo.addItem(name, name)
        self.dtype_combo.setToolTip("16-bit type of the merged weights: the base's own 16-bit type (bf16 for an fp32 "
                                    "base), or bf16 (keeps the range) or fp16 (keeps the precision)")
        self.samples_spin = QSpinBox()
        self.samples_spin.setRange(1, CALIBRATION_SAMPLES_MAX)
        self.samples_spin.setValue(CALIBRATION_SAMPLES_DEFAULT)
        self.samples_spin.setSuffix(" rows")
        self.samples_spin.setToolTip("Rows of the run's training data (spread evenly over it, at most 512 tokens each) "
                                     "that GPTQ, AWQ and SmoothQuant fit their scales to. More take longer; "
                                     f"{CALIBRATION_SAMPLES_DEFAULT} is the default, as the CLI's --calibration-samples.")
        self.out_edit = QLineEdit()
        self.out_edit.textEdited.connect(self._on_out_edit_text_edited)
        self.browse_button = QPushButton("Browse…")
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        out_row = QHBoxLayout()
        out_row.addWidget(self.out_edit, 1)
        out_row.addWidget(self.browse_button)
        self.overwrite_check = QCheckBox("Overwrite an existing export in that folder")
        form = QFormLayout()
        form.addRow("Format", self.format_combo)
        form.addRow("Weights dtype", self.dtype_combo)
        self.samples_label = QLabel("Calibration")
        self.samples_label.setToolTip(self.samples_spin.toolTip())
        form.addRow(self.samples_label, self.samples_spin)
        self.export_form = form
        form.addRow("Output folder", out_row)
        form.addRow("", self.overwrite_check)

        self.export_button = QPushButton("Export")
        self.export_button.clicked.connect(self._on_export_button_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.jobs.cancel)
        self.open_button = QPushButton("Open folder")
        self.open_button.clicked.connect(self._on_open_button_clicked)
        buttons = QHBoxLayout()
        for button in (self.export_button, self.stop_button, self.open_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # paths to copy
        self.report = ExportReportWidget()

        export_box = QGroupBox("Export")
        export_layout = QVBoxLayout(export_box)
        export_layout.addLayout(form)
        export_layout.addWidget(self.format_help)  # under the form: as a form row its wrapped lines were cut off
        export_layout.addLayout(buttons)
        export_layout.addWidget(self.progress)
        export_layout.addWidget(self.status_label)
        export_layout.addWidget(self.report, 1)
        self.evaluation = EvaluationWidget(eval_jobs)
        eval_box = QGroupBox("Evaluate: base vs tuned")
        QVBoxLayout(eval_box).addWidget(self.evaluation)
        split = QSplitter()
        split.addWidget(export_box)
        self.prune = PruneWidget(JobController(None, jobs.worker_command, jobs.worker_env, parent=self))
        self.serve = ServeWidget()  # the run's export behind an OpenAI-compatible server
        self.serve.set_target(self.picker.path())
        self.side_tabs = QTabWidget()  # Evaluate, Prune and Serve share the right column
        self.side_tabs.addTab(eval_box, "Evaluate")
        self.side_tabs.addTab(self.prune, "Prune")
        self.side_tabs.addTab(VerticalScrollArea(self.serve), "Serve")  # a small window scrolls it
        split.addWidget(self.side_tabs)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(self.picker)
        layout.addWidget(split, 1)

        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        for each in (jobs, eval_jobs, self.prune.jobs):
            each.running_changed.connect(lambda _running: self._update_buttons())
        self._on_format_combo_current_index_changed(0)
        self._update_buttons()

    # --- choices --------------------------------------------------------------------------------
    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        self.refresh_runs()

    def refresh_runs(self) -> None:
        """Re-read the finished runs (the picker may follow a new one), unless an export, evaluation or prune
        runs: the run it works on must stay the one shown."""
        if not self.busy():
            self.picker.refresh()

    def busy(self) -> bool:
        """An export, evaluation or prune of the shown run is running."""
        return any(jobs.is_running() for jobs in (self.jobs, self.evaluation.jobs, self.prune.jobs))

    def fmt(self) -> str:
        return str(self.format_combo.currentData())

    def set_format(self, name: str) -> None:
        self.format_combo.setCurrentIndex(self.format_combo.findData(name))

    def default_out(self) -> str:
        path = self.picker.path()
        return str(Path(path) / "exports" / self.fmt()) if path else ""

    def out_path(self) -> Path | None:
        text = self.out_edit.text().strip()
        return Path(text).expanduser() if text else None

    def _forget_export(self) -> None:
        """Clear the last export's progress, verdict and checks: they were about another run or format."""
        self._out = None
        self.report.clear("")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self._say("")

    def _on_picker_run_changed(self, path: str) -> None:
        self._forget_export()  # another run: the last export's result belongs to the run it was made from
        if not self._out_edited:
            self.out_edit.setText(self.default_out())
        self.evaluation.set_run(path)
        self.prune.set_run(path)
        self.serve.set_target(path)
        self._grey_formats(path)
        self._update_buttons()

    def _grey_formats(self, path: str) -> None:
        """A vision-language run's formats that are not built yet are greyed, the job's refusal as their tooltip."""
        try:
            family = VisionFolder.read(RunFolder(Path(path)).load_config().resolved_model_path()).family if path else None
        except (OSError, ConfigError, ValueError):
            family = None  # an unreadable run: the job says why when it starts
        self._family = family
        model = self.format_combo.model()
        for index in range(self.format_combo.count()):
            name = self.format_combo.itemData(index)
            refusal = vision_refusal(name, family.label) if family is not None else None
            model.item(index).setEnabled(refusal is None)
            self.format_combo.setItemData(index, f"{refusal[0]}; {refusal[1]}" if refusal else FORMATS[name], 3)
        if family is not None and vision_refusal(self.fmt(), family.label):
            self.set_format("merged")
        self._show_format_help()

    def _on_format_combo_current_index_changed(self, _index: int) -> None:
        if not self.jobs.is_running():  # the last export's verdict was about another format
            self._forget_export()
        self._show_format_help()
        self.dtype_combo.setEnabled(self.fmt() in DTYPE_FORMATS)
        self.export_form.setRowVisible(self.samples_label, self.fmt() in CALIBRATED)
        if not self._out_edited:
            self.out_edit.setText(self.default_out())

    def _show_format_help(self) -> None:
        """The format's description; for a vision-language run, also what the export holds of its image side."""
        writes = export_format(self.fmt()).vision_writes if self._family is not None else ""
        self.format_help.setText(f"{self.fmt()}: {FORMATS.get(self.fmt(), '')}"
                                 + (f". Of this {self._family.label} run: {writes}" if writes else ""))

    def _on_out_edit_text_edited(self, text: str) -> None:
        self._out_edited = bool(text.strip())

    def _on_browse_button_clicked(self) -> None:
        chosen = QFileDialog.getExistingDirectory(self, "Export into", self.out_edit.text())
        if chosen:
            self.out_edit.setText(chosen)
            self._out_edited = True

    def _ask_overwrite(self, path: Path) -> bool:
        answer = QMessageBox.question(self, "Replace the export?", f"{path} already exists. Replace what it holds "
                                      "with this export? (The old files are removed only once the new ones are "
                                      "written and verified.)")
        return answer == QMessageBox.StandardButton.Yes

    # --- export ---------------------------------------------------------------------------------
    def _on_export_button_clicked(self) -> None:
        folder, out = self.picker.folder(), self.out_path()
        if folder is None or out is None or self.jobs.is_running():
            return
        refusal = overwrite_refusal(out)
        if refusal:
            self._say(refusal[0].upper() + refusal[1:] + ".", error=True)
            return
        if out.exists() and any(out.iterdir()):
            if not self.overwrite_check.isChecked():
                self._say(f"{out} already holds an export: tick Overwrite, or pick another folder.", error=True)
                return
            if not self.confirm_overwrite(out):
                return
        try:
            config = folder.load_config()
        except ValueError as exc:
            self._say(f"cannot read {folder.config_path}: {exc}", error=True)
            return
        params: dict[str, Any] = {"format": self.fmt(), "out": str(out),
                                  "overwrite": self.overwrite_check.isChecked()}
        if self.fmt() in DTYPE_FORMATS and self.dtype_combo.currentData():
            params["dtype"] = self.dtype_combo.currentData()
        if self.fmt() in CALIBRATED:
            params["calibration_samples"] = self.samples_spin.value()
        self._out = out
        self.report.clear("Exporting…")
        self.progress.setRange(0, 0)
        self._say(f"Exporting {folder.run_id} as {self.fmt()}…")
        self.jobs.start(folder, config, job="export", params=params)

    def _on_jobs_event_received(self, event: Any) -> None:
        if isinstance(event, MetricsLogged) and event.max_steps:
            self.progress.setRange(0, event.max_steps)
            self.progress.setValue(min(event.step, event.max_steps))
        elif isinstance(event, PhaseChanged):
            self._say(f"{event.phase.replace('_', ' ').capitalize()}: {event.detail}" if event.detail
                      else event.phase)

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        self.progress.setRange(0, 1)
        self.progress.setValue(1 if outcome.ok else 0)
        self._show_report()
        if outcome.status == "stopped" or outcome.status == "cancelled":
            self._say("Stopped: nothing was exported." if outcome.status == "cancelled" else "Stopped.")
        elif not outcome.ok:
            self._say(failure_text("Export", outcome), error=True)
            self.status_label.setToolTip(outcome.report)
        elif self._out is not None and (self._out / REPORT).is_file():
            self._say("")  # the report's verdict says it once, with the folder
        else:
            self._say(f"Exported: {self._out}")

    def _show_report(self) -> None:
        if self._out is not None and (self._out / REPORT).is_file():
            self.report.load(self._out / REPORT)

    def _on_open_button_clicked(self) -> None:
        out = self.out_path()
        target = out if out is not None and out.exists() else (Path(self.picker.path()) if self.picker.path() else None)
        problem = open_folder(self.open_url, target) if target is not None else ""
        if problem:
            self._say(problem, error=True)

    def _update_buttons(self) -> None:
        running = self.jobs.is_running()
        has_run = bool(self.picker.path())
        self.export_button.setEnabled(has_run and not running)
        self.stop_button.setEnabled(running)
        self.picker.setEnabled(not self.busy())
        self.open_button.setEnabled(has_run)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setToolTip("")
        self.status_label.setStyleSheet("color: #dc2626;" if error else "")
