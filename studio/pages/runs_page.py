"""RunsPage: step 5, every past run: compare curves and configs, open, resume or delete.

The list comes from RunIndex, re-synced from the run folders whenever the page is shown (the
folders are the truth), with each run's predicted against measured memory from its memory.json.
Selecting runs overlays their loss curves; selecting two also lists every config field in which
they differ.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QItemSelectionModel, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from backend.core.runs.memory_record import MemoryRecord
from backend.api.run_index import RunIndex
from backend.core.runs.run_folder import RunFolder, RunSummary
from studio.services.open_folder import open_folder
from studio.state.config_state import diff_configs
from studio.state.run_metrics import LOSS, RunMetrics
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.chart_legend import with_legend
from studio.widgets.run_overlay_chart import RunOverlayChart
from studio.widgets.run_picker_widget import STATUS_WORDS, resume_words, when_text

COLUMNS = ("Run", "Status", "Steps", "Final loss", "Useful tokens/s", "Method", "Model", "Started", "Memory")
CLAMPED = {"Run": 200, "Status": 220, "Model": 220}
"""Columns whose text can be long (a failure's message, a model path): at most this wide, elided, whole
on hover, so they never push the other columns off screen."""
MAX_OVERLAY = 8
METRIC_NAMES = {"loss": "Training loss", "rewards/chosen": "Reward of chosen answers",
                "rewards/rejected": "Reward of rejected answers", "rewards/margins": "Reward margin",
                "rewards/accuracies": "Preference accuracy", "reward": "Mean reward", "reward_std": "Reward spread",
                "kl": "KL to the reference", "completions/mean_length": "Completion length (tokens)",
                "entropy": "Entropy", "eval_loss": "Evaluation loss", "learning_rate": "Learning rate",
                "grad_norm": "Gradient norm", "tokens_per_s": "Useful tokens/s",
                "frac_reward_zero_std": "Share of groups with no reward spread",
                "logps/chosen": "Log-probability of chosen answers",
                "logps/rejected": "Log-probability of rejected answers"}
"""Readable names of the metrics the Compare combo offers (others are named by metric_title's rules)."""
PREFIXES = {"completions": "Completion", "clip_ratio": "Clipped share", "logps": "Log-probability",
            "logits": "Logits", "rewards": "Reward"}
"""The first part of a logged name, in words: "clip_ratio/low_mean" -> "Clipped share (low mean)"."""


def metric_title(name: str) -> str:
    """"rewards/margins" -> "Reward margin"; rewards/<label>/mean -> "Reward <label> (mean)"; any other
    name in words, never the raw key beside readable ones."""
    if name in METRIC_NAMES:
        return METRIC_NAMES[name]
    parts = name.split("/")
    if len(parts) == 3 and parts[0] == "rewards":
        return f"Reward {parts[1]} ({'spread' if parts[2] == 'std' else parts[2]})"
    words = [part.replace("_", " ") for part in parts]
    head = PREFIXES.get(parts[0], words[0][:1].upper() + words[0][1:])
    return f"{head} ({', '.join(words[1:])})" if len(words) > 1 else head


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def memory_cell(path: str) -> QTableWidgetItem:
    """Predicted against measured memory, from the run's memory.json ("—" where it wrote none)."""
    record = MemoryRecord.read(path)
    if record is None:
        return _cell("—")
    item = _cell(record.comparison())
    item.setToolTip(f"{record.comparison()}\n{record.device}, {record.outcome}: measured as {record.measured_kind}"
                    + (f"; {record.calibration}" if record.calibration else ""))  # the cell is often cut
    return item


def _cell(text: str, data: object = None, right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    if data is not None:
        item.setData(Qt.ItemDataRole.UserRole, data)
    if right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


class RunsPage(QWidget):
    """The run table, its buttons, the loss overlay and the config diff."""

    resume_requested = Signal(str)
    """Emitted with a run folder path when the person asked to resume it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._index: RunIndex | None = None
        self.run_metrics = RunMetrics()
        self.summaries: list[RunSummary] = []
        self.confirm_delete: Callable[[list[RunSummary]], bool] = self._ask_delete
        """Asked before deleting; tests replace it to skip the dialog."""
        self.open_url: Callable[[QUrl], object] = QDesktopServices.openUrl
        """Opens a folder in the file manager; tests replace it."""
        self._running_dir = ""
        """The folder of the run in progress (never deleted)."""
        header = PageHeaderWidget("Runs", "Every run so far. Select runs to overlay their loss curves; select "
                                          "two to see how their configs differ.")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.setWordWrap(False)
        for name in CLAMPED:
            self.table.horizontalHeader().setSectionResizeMode(COLUMNS.index(name), QHeaderView.ResizeMode.Interactive)
        self.table.itemSelectionChanged.connect(self._on_table_item_selection_changed)
        self.table.itemDoubleClicked.connect(lambda _item: self.open_selected())

        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(self.refresh)
        self.open_button = QPushButton("Open folder")
        self.open_button.clicked.connect(self.open_selected)
        self.config_button = QPushButton("Open config")
        self.config_button.setToolTip("Open the selected run's config.yaml (the CLI trains the same file)")
        self.config_button.clicked.connect(self.open_config)
        self.resume_button = QPushButton("Resume")
        self.resume_button.setToolTip("Continue the selected run from its newest complete checkpoint")
        self.resume_button.clicked.connect(self._on_resume_button_clicked)
        self.delete_button = QPushButton("Delete…")
        self.delete_button.clicked.connect(self.delete_selected)
        buttons = QHBoxLayout()
        for button in (self.refresh_button, self.open_button, self.config_button, self.resume_button,
                       self.delete_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        self.count_label = QLabel()
        buttons.addWidget(self.count_label)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status_label.setVisible(False)

        self.overlay = RunOverlayChart()
        self.metric_combo = QComboBox()
        self.metric_combo.setToolTip("The metric to compare across the selected runs: the loss, or what a DPO, KTO "
                                     "or GRPO run logged (rewards, margins, accuracy, KL, completion length)")
        self.metric_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.metric_combo.currentIndexChanged.connect(self._on_metric_combo_current_index_changed)
        compare_row = QHBoxLayout()
        compare_row.setContentsMargins(0, 0, 0, 0)
        compare_row.addWidget(QLabel("Compare"))
        compare_row.addWidget(self.metric_combo)
        compare_row.addStretch(1)
        compare = QWidget()
        compare_layout = QVBoxLayout(compare)
        compare_layout.setContentsMargins(0, 0, 0, 0)
        compare_layout.addLayout(compare_row)
        compare_layout.addWidget(with_legend(self.overlay), 1)
        self.diff_table = QTableWidget(0, 3)
        self.diff_table.setHorizontalHeaderLabels(["Field", "A", "B"])
        self.diff_table.verticalHeader().setVisible(False)
        self.diff_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        columns = self.diff_table.horizontalHeader()
        columns.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        columns.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        columns.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.diff_label = QLabel("Select two runs to compare their configs.")
        self.diff_label.setWordWrap(True)
        diff = QWidget()
        diff_layout = QVBoxLayout(diff)
        diff_layout.setContentsMargins(0, 0, 0, 0)
        diff_layout.addWidget(self.diff_label)
        diff_layout.addWidget(self.diff_table, 1)
        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(compare)
        lower.addWidget(diff)
        lower.setStretchFactor(0, 3)
        lower.setStretchFactor(1, 2)
        lower.setSizes([600, 400])
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(lower)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        split.setSizes([200, 400])
        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        layout.addWidget(split, 1)
        self._update_buttons()

    # --- the list -------------------------------------------------------------------------------
    def index(self) -> RunIndex:
        if self._index is None:
            self._index = RunIndex()
        return self._index

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        self.refresh()

    def refresh(self) -> None:
        """Re-read the run folders and redraw the table, keeping the selection where possible."""
        keep = {s.run_id for s in self.selected()}
        self.summaries = self.index().sync()
        self.table.blockSignals(True)
        self.table.setRowCount(len(self.summaries))
        for row, s in enumerate(self.summaries):
            running = bool(self._running_dir) and Path(s.path) == Path(self._running_dir)
            status = "running" if running else STATUS_WORDS.get(s.status, s.status)  # as the pickers say it
            cells = (
                _cell(s.name, s.run_id), _cell(f"{status}: {_first_line(s.reason)}" if s.reason else status),
                _cell(f"{s.steps:,}", right=True),
                _cell(f"{s.final_loss:.4f}" if s.final_loss is not None else "—", right=True),
                _cell(f"{s.tokens_per_s:,.0f}" if s.tokens_per_s else "—", right=True),
                _cell(s.method), _cell(s.model), _cell(when_text(s.created)),
                memory_cell(s.path),
            )
            cells[0].setToolTip(s.path)
            cells[1].setToolTip(s.reason)  # the whole message: the cell elides it
            cells[6].setToolTip(s.model)
            for column, item in enumerate(cells):
                self.table.setItem(row, column, item)
        self._select_rows([row for row, s in enumerate(self.summaries) if s.run_id in keep])
        self.table.blockSignals(False)
        self._fit_columns()
        self.count_label.setText(f"{len(self.summaries)} run(s)")
        self._on_table_item_selection_changed()

    def _fit_columns(self) -> None:
        """The clamped columns as wide as their text, up to their limit (the view elides the rest)."""
        for name, limit in CLAMPED.items():
            column = COLUMNS.index(name)
            self.table.resizeColumnToContents(column)
            self.table.setColumnWidth(column, min(self.table.columnWidth(column), limit))

    def selected(self) -> list[RunSummary]:
        rows = sorted({index.row() for index in self.table.selectionModel().selectedRows()})
        return [self.summaries[r] for r in rows if r < len(self.summaries)]

    def select_runs(self, run_ids: list[str]) -> None:
        self._select_rows([row for row, s in enumerate(self.summaries) if s.run_id in run_ids])

    def _select_rows(self, rows: list[int]) -> None:
        """Select exactly these rows (selectRow would keep only the last one)."""
        self.table.clearSelection()
        model, flags = self.table.selectionModel(), QItemSelectionModel.SelectionFlag
        for row in rows:
            model.select(self.table.model().index(row, 0), flags.Select | flags.Rows)

    # --- actions ----------------------------------------------------------------------------------
    def open_selected(self) -> None:
        for s in self.selected()[:1]:
            self.set_status(open_folder(self.open_url, s.path))

    def set_status(self, text: str) -> None:
        """One sentence under the buttons (hidden when there is nothing to say)."""
        self.status_label.setText(text)
        self.status_label.setVisible(bool(text))

    def open_config(self) -> None:
        for s in self.selected()[:1]:
            self.set_status(open_folder(self.open_url, RunFolder(s.path).config_path).replace("the folder", "the config"))

    def _on_resume_button_clicked(self) -> None:
        chosen = self.selected()
        if len(chosen) == 1:
            self.resume_requested.emit(chosen[0].path)

    def set_running_dir(self, path: str) -> None:
        """The run folder a worker is training in now ("" when none): it cannot be deleted."""
        self._running_dir = path

    def delete_selected(self) -> None:
        running = self._running_dir
        chosen = [s for s in self.selected() if not running or Path(s.path) != Path(running)]
        if not chosen or not self.confirm_delete(chosen):
            return
        for s in chosen:
            self.index().delete(s.run_id)
        self.refresh()

    def _ask_delete(self, runs: list[RunSummary]) -> bool:
        names = "\n".join(f"• {s.name} ({s.run_id})" for s in runs[:10])
        more = f"\n… and {len(runs) - 10} more" if len(runs) > 10 else ""
        answer = QMessageBox.question(self, "Delete runs",
                                      f"Delete {len(runs)} run folder(s) with their checkpoints and "
                                      f"adapters? This cannot be undone.\n\n{names}{more}",
                                      QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                                      QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes

    # --- comparing --------------------------------------------------------------------------------
    def loss_curve(self, path: str) -> tuple[list[float], list[float]]:
        """(steps, losses) of a run, read once per version of its events.jsonl."""
        return self.run_metrics.series(path, LOSS)

    def metric(self) -> str:
        """The metric the overlay compares (the loss unless another was chosen)."""
        return str(self.metric_combo.currentData() or LOSS)

    def set_metric(self, name: str) -> None:
        index = self.metric_combo.findData(name)
        if index >= 0:
            self.metric_combo.setCurrentIndex(index)

    def _on_table_item_selection_changed(self) -> None:
        chosen = self.selected()
        self._offer_metrics(chosen[:MAX_OVERLAY])
        self._show_overlay(chosen)
        self._show_diff(chosen)
        self._update_buttons()

    def _offer_metrics(self, chosen: list[RunSummary]) -> None:
        """The Compare combo: every metric the selected runs logged (the choice kept while one still has it)."""
        current = self.metric()
        names = self.run_metrics.names([s.path for s in chosen])
        self.metric_combo.blockSignals(True)
        self.metric_combo.clear()
        for name in names:
            self.metric_combo.addItem(metric_title(name), name)
        self.metric_combo.setCurrentIndex(max(0, self.metric_combo.findData(current)))
        self.metric_combo.blockSignals(False)
        self.metric_combo.setEnabled(len(names) > 1)

    def _on_metric_combo_current_index_changed(self, _index: int) -> None:
        self._show_overlay(self.selected())

    def _show_overlay(self, chosen: list[RunSummary]) -> None:
        name = self.metric()
        runs = []
        for s in chosen[:MAX_OVERLAY]:
            steps, values = self.run_metrics.series(s.path, name)
            if steps or name == LOSS:
                runs.append((s.name if len(chosen) == 1 else f"{s.name} · {s.run_id[-4:]}", steps, values))
        title = metric_title(name)
        self.overlay.set_runs(runs, f"{title} of the selected runs", "loss" if name == LOSS else "")

    def _show_diff(self, chosen: list[RunSummary]) -> None:
        self.diff_table.setRowCount(0)
        if len(chosen) != 2:
            self.diff_label.setText("Select two runs to compare their configs.")
            return
        a, b = chosen
        try:
            rows = diff_configs(RunFolder(a.path).load_config().model_dump(mode="json"),
                                RunFolder(b.path).load_config().model_dump(mode="json"))
        except (ValueError, OSError) as exc:
            self.diff_label.setText(f"Cannot compare: {exc}")
            return
        rows = [r for r in rows if r[0] != "name"] if a.name == b.name else rows
        self.diff_label.setText(f"{len(rows)} field(s) differ: A = {a.name} ({a.run_id[-4:]}), "
                                f"B = {b.name} ({b.run_id[-4:]})" if rows else "The two configs are identical.")
        self.diff_label.setToolTip(f"A = {a.path}\nB = {b.path}")
        self.diff_table.setHorizontalHeaderLabels(["Field", "A", "B"])
        self.diff_table.setRowCount(len(rows))
        for row, (key, va, vb) in enumerate(rows):
            for column, text in enumerate((key, str(va), str(vb))):
                self.diff_table.setItem(row, column, _cell(text))

    def _update_buttons(self) -> None:
        chosen = self.selected()
        self.open_button.setEnabled(len(chosen) == 1)
        self.delete_button.setEnabled(bool(chosen))
        self.config_button.setEnabled(len(chosen) == 1)
        text, tip = resume_words(RunFolder(chosen[0].path)) if len(chosen) == 1 else ("", "")
        self.resume_button.setEnabled(bool(text))
        self.resume_button.setText(text or "Resume")
        self.resume_button.setToolTip(tip or "Select one run with a complete checkpoint to resume it")
