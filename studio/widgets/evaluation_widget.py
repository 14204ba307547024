"""EvaluationWidget: the base and the tuned model side by side for one run (perplexity and exact match;
GRPO's mean reward, DPO's pairs ranked right, KTO's answers moved as labelled: backend.api.evaluation_rows).

Evaluate runs the evaluate job (backend/jobs/evaluate.py) in a fresh worker on the run's folder;
the figures come from the eval_report.json it writes there (an existing report is shown as soon as
the run is picked). A skipped measure says why. While it runs, a bar follows the job's phases: busy
while a model loads, filling as a measure's "k/N" count (e.g. "perplexity base 3/20 examples") grows.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from backend.api.evaluation_rows import report_note, report_rows
from backend.core.protocol import PhaseChanged
from backend.core.runs.run_folder import RunFolder
from studio.job_controller import JobController, JobOutcome, failure_text

REPORT = "eval_report.json"
COUNT = re.compile(r"(\d+)/(\d+)")
"""A phase's progress in its detail: "base 3/20 examples"."""
LEGEND = "↓ lower is better · ↑ higher is better"
ROWS = tuple((row.label, row.tip) for row in report_rows(None))
"""An SFT run's (row label, its tooltip): short labels, so the table reads in the narrow Evaluate column."""


class EvaluationWidget(QWidget):
    """Evaluate / Stop, a status line, a Base | Tuned table and a few example answers."""

    def __init__(self, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self._path = ""
        self.evaluate_button = QPushButton("Evaluate")
        self.evaluate_button.setToolTip("Measure the base and the tuned model on the run's validation split "
                                        "and held-out prompts")
        self.evaluate_button.clicked.connect(self._on_evaluate_button_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.jobs.cancel)
        buttons = QHBoxLayout()
        buttons.addWidget(self.evaluate_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setFormat("%v / %m")  # the measure's count; a busy bar (a model loading) shows none
        self.progress.setVisible(False)
        self.table = QTableWidget(len(ROWS), 2)
        self.table.setHorizontalHeaderLabels(("Base", "Tuned"))
        for row, (label, tip) in enumerate(ROWS):
            item = QTableWidgetItem(label)
            item.setToolTip(tip)
            self.table.setVerticalHeaderItem(row, item)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.legend = QLabel(LEGEND)
        self.legend.setWordWrap(True)
        self.legend.setStyleSheet("color: palette(placeholder-text);")
        self.examples = QTextBrowser()
        self.examples.setPlaceholderText("Both models' example answers show here.")  # short: never cut
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        layout.addWidget(self.progress)
        layout.addWidget(self.table)
        layout.addWidget(self.legend)
        layout.addWidget(self.examples, 1)
        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        jobs.running_changed.connect(self._on_jobs_running_changed)
        self.show_report(None)
        self._update_buttons()

    def set_run(self, path: str) -> None:
        """The run to evaluate; its existing report (if any) is shown."""
        if self.jobs.is_running() or path == self._path:
            return
        self._path = path
        self._say("")
        self._load()
        self._update_buttons()

    def _on_evaluate_button_clicked(self) -> None:
        if not self._path or self.jobs.is_running():
            return
        folder = RunFolder(self._path)
        try:
            config = folder.load_config()
        except ValueError as exc:
            self._say(f"cannot read {folder.config_path}: {exc}", True)
            return
        self._say("Evaluating the base and the tuned model…")
        self.jobs.start(folder, config, job="evaluate")

    def _on_jobs_event_received(self, event: Any) -> None:
        if isinstance(event, PhaseChanged):
            self._say(f"{event.phase.replace('_', ' ').capitalize()}: {event.detail}" if event.detail else event.phase)
            count = COUNT.search(event.detail or "")
            if count and int(count.group(2)) > 0:
                self.progress.setRange(0, int(count.group(2)))
                self.progress.setValue(min(int(count.group(1)), int(count.group(2))))
            else:
                self.progress.setRange(0, 0)  # busy: loading a model, tokenizing, writing the report

    def _on_jobs_running_changed(self, running: bool) -> None:
        self.progress.setRange(0, 0)
        self.progress.setVisible(running)
        self._update_buttons()

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        if outcome.ok:
            self._say("")
            self._load()
        elif outcome.status == "cancelled":
            self._say("Evaluation stopped: nothing was measured.")
        else:
            self._say(failure_text("Evaluation", outcome), True)

    def _load(self) -> None:
        report = None
        if self._path:
            try:
                report = json.loads((Path(self._path) / REPORT).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                report = None
        self.show_report(report)

    def _fit_table(self) -> None:
        """Exactly as tall as its rows and wide enough for every figure: it never scrolls or elides."""
        table, frame = self.table, 2 * self.table.frameWidth()
        table.resizeRowsToContents()
        table.setFixedHeight(table.verticalHeader().length() + table.horizontalHeader().height() + frame)
        header = table.horizontalHeader()
        columns = sum(max(header.sectionSizeHint(c), table.sizeHintForColumn(c)) for c in range(table.columnCount()))
        table.setMinimumWidth(frame + table.verticalHeader().sizeHint().width() + columns)

    def show_report(self, report: dict[str, Any] | None) -> None:
        rows = report_rows(report)
        self.table.setRowCount(len(rows))
        for index, row in enumerate(rows):
            header = QTableWidgetItem(row.label)
            header.setToolTip(row.tip)
            self.table.setVerticalHeaderItem(index, header)
            self.table.setItem(index, 0, QTableWidgetItem(row.base))
            self.table.setItem(index, 1, QTableWidgetItem(row.tuned))
        self.examples.clear()
        note = report_note(report) if report else ""
        self.legend.setText(f"{LEGEND}. {note[0].upper()}{note[1:]}" if note else LEGEND)  # what was measured
        if not report:
            self._fit_table()
            return
        self._fit_table()
        skipped = report.get("skipped") or []
        if skipped and not self.status_label.text():
            self._say("; ".join(skipped))
        parts = []
        for example in report.get("examples") or []:
            marks = {k: "✓" if example.get(f"{k}_match") else "✗" for k in ("base", "tuned")}
            parts.append(f"<p><b>{html.escape(str(example.get('prompt', '')))}</b><br>"
                         f"expected: {html.escape(str(example.get('expected', '')))}<br>"
                         f"base {marks['base']}: {html.escape(str(example.get('base', '')))}<br>"
                         f"tuned {marks['tuned']}: {html.escape(str(example.get('tuned', '')))}</p>")
        self.examples.setHtml("".join(parts))

    def figures(self) -> list[tuple[str, str]]:
        """(base, tuned) text of each row (for tests)."""
        return [(self.table.item(r, 0).text(), self.table.item(r, 1).text()) for r in range(self.table.rowCount())]

    def _update_buttons(self) -> None:
        running = self.jobs.is_running()
        self.evaluate_button.setEnabled(bool(self._path) and not running)
        self.stop_button.setEnabled(running)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #dc2626;" if error else "")
