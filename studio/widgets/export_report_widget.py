"""ExportReportWidget: the verification of an export, one row per check, a failed check in red.

Reads export_report.json (backend/jobs/export.py): each check has a name, what it measures, the
measured figure (the perplexity's with its standard error and token count), the tolerance and its
outcome (backend/core/runs/export_report.py: passed, failed or not verified). Nothing is hidden: a failed check is shown with its figure, in red, above the verdict; a
check no independent reader could run is "not verified", in amber, with how to run it elsewhere,
never "pass" nor "FAIL".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget

from backend.core.runs.export_report import FAILED, NOT_VERIFIED, check_outcome, report_outcome
from studio.widgets.units import human_bytes

COLUMNS = ("Check", "Measured", "Tolerance", "Result", "What it measures")
RED, GREEN, AMBER = "#dc2626", "#16a34a", "#d97706"


def figure(name: str, value: Any) -> str:
    """A measured figure or tolerance as a person reads it (perplexity as a relative change)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if name == "perplexity":
        return f"{value:+.2%}"
    return f"{value:.3g}"


class ExportReportWidget(QWidget):
    """The verdict line and the table of checks of one export_report.json."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.unverified: list[str] = []
        self.verdict = QLabel("No export yet.")
        self.verdict.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.verdict)
        layout.addWidget(self.table, 1)

    def load(self, path: Path) -> bool:
        """Show the report at `path`; False (and a sentence saying so) when it is missing or unreadable."""
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.clear(f"No verification report at {path}.")
            return False
        self.show_report(report)
        return True

    def clear(self, text: str = "No export yet.") -> None:
        self.unverified = []
        self.verdict.setText(text)
        self.verdict.setStyleSheet("")
        self.table.setRowCount(0)

    def show_report(self, report: dict[str, Any]) -> None:
        checks = report.get("checks") or []
        outcome = report_outcome(report)
        size = f", {human_bytes(report['total_bytes'])}" if report.get("total_bytes") else ""
        unverified = [c["name"] for c in checks if check_outcome(c) == NOT_VERIFIED]
        self.unverified = unverified
        if outcome == FAILED:
            word = "FAILED " + ", ".join(c["name"] for c in checks if check_outcome(c) == FAILED)
        elif outcome == NOT_VERIFIED:
            word = "written, not verified (" + ", ".join(unverified) + ": no independent reader here)"
        else:
            word = "passed every check"
        self.verdict.setText(f"{report.get('format', '?')} export {word}{size}: {report.get('path', '')}")
        colour = {FAILED: RED, NOT_VERIFIED: AMBER}.get(outcome, GREEN)
        self.verdict.setStyleSheet(f"color: {colour}; font-weight: bold;")
        how = next((c.get("how_to_verify") for c in checks if c.get("how_to_verify")), None)
        self.verdict.setToolTip(f"To check it elsewhere: {how}" if how else "")
        self.table.setRowCount(len(checks))
        for row, check in enumerate(checks):
            name = str(check.get("name", ""))
            open_ = check_outcome(check) == NOT_VERIFIED
            ok = check_outcome(check) != FAILED
            result = "FAIL" if not ok else "not verified" if open_ else "pass"
            measured = "not verified" if open_ else check.get("shown") or figure(name, check.get("measured"))
            cells = (name, measured, figure(name, check.get("tolerance")), result, str(check.get("what", "")))
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if not ok:
                    item.setForeground(QColor(RED))
                elif column == 3:
                    item.setForeground(QColor(AMBER if open_ else GREEN))
                if open_:
                    item.setToolTip(f"{check.get('reason') or check.get('measured')}. To check it elsewhere: "
                                    f"{check.get('how_to_verify') or 'llama.cpp'}")
                else:  # a narrow window cuts the cell: the whole text on hover, with the standard error's verdict
                    item.setToolTip(f"{text}: {check['precision']}" if column == 1 and check.get("precision") else text)
                self.table.setItem(row, column, item)

    def rows(self) -> list[tuple[str, ...]]:
        """The table's text, row by row (for tests)."""
        return [tuple(self.table.item(r, c).text() for c in range(self.table.columnCount()))
                for r in range(self.table.rowCount())]
