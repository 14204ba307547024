"""FitDialog: the Make it fit proposal (backend.estimate.fit's FitPlan), applied to the draft in one click.

A dialog rather than a panel on the page: the proposal's two tables need room the Techniques page
does not have at 1280x800 without scrolling. Each change shows its settings, its speed cost (the
bench's figure, or that none was measured on a GPU yet) and the total before and after; the parts
table shows every part before and after the whole plan.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.state.config_state import ConfigState
from studio.widgets.memory_breakdown_widget import PART_WORDS
from studio.widgets.units import human_bytes


def _table(headers: list[str], rows: list[list[str]], stretch: int, tips: list[str] | None = None) -> QTableWidget:
    table = QTableWidget(len(rows), len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
    table.setWordWrap(True)
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            item = QTableWidgetItem(text)
            if tips:
                item.setToolTip(tips[r])
            table.setItem(r, c, item)
    header = table.horizontalHeader()
    for c in range(len(headers)):
        header.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    header.sectionResized.connect(lambda *_: table.resizeRowsToContents())  # wrapped text follows the widths
    table.resizeRowsToContents()
    return table


def _value(value: Any) -> str:
    """A value as the CLI's --set writes it (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _part_changes(before: dict[str, int], after: dict[str, int]) -> str:
    """'activations 5.83 GiB -> 2.90 GiB' for each part a step changed, one a line."""
    return "\n".join(f"{PART_WORDS.get(p, p)}: {human_bytes(before.get(p, 0))} -> {human_bytes(after.get(p, 0))}"
                     for p in {**before, **after} if before.get(p, 0) != after.get(p, 0))


class FitDialog(QDialog):
    """The plan's changes and parts; Apply sets every change's dotted key in the config state."""

    def __init__(self, plan: Any, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Make it fit")
        self.plan, self._state = plan, state
        self.summary = QLabel(plan.sentence()[0].upper() + plan.sentence()[1:] + ".")
        self.summary.setWordWrap(True)
        rows = [[step.speed.title, step.speed.sentence(), "\n".join(f"{k} = {_value(v)}" for k, v in step.changes),
                 f"{human_bytes(step.total_before)} -> {human_bytes(step.total_after)}"] for step in plan.steps]
        self.steps = _table(["Change", "Speed cost", "Sets", "Total"], rows, 1,
                            [_part_changes(step.before, step.after) for step in plan.steps])
        self.steps.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.steps.setColumnWidth(0, 190)  # the titles wrap; the speed cost takes the width
        self.steps.resizeRowsToContents()
        parts = list({**plan.before, **plan.after})
        self.parts = _table(["Part", "Before", "After"],
                            [[PART_WORDS.get(p, p), human_bytes(plan.before.get(p, 0)), human_bytes(plan.after.get(p, 0))]
                             for p in parts] + [["Total (the step's peak)", human_bytes(plan.total_before),
                                                 human_bytes(plan.total_after)]], 0)
        for column in (1, 2):
            for row in range(self.parts.rowCount()):
                self.parts.item(row, column).setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        skipped = "; ".join(plan.skipped_lines())
        self.skipped = QLabel(f"Not proposed: {skipped}." if skipped else "")
        self.skipped.setWordWrap(True)
        self.skipped.setStyleSheet("color: palette(placeholder-text);")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Cancel)
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.apply_button.setEnabled(bool(plan.steps))
        self.apply_button.setToolTip("Sets these values on the Techniques page; the estimate follows.")
        self.apply_button.clicked.connect(self.apply)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(QLabel("<b>Changes</b>, least speed lost first (hover a row for the parts it changes):"))
        layout.addWidget(self.steps, 1)
        layout.addWidget(QLabel("<b>Parts</b> before and after every change:"))
        layout.addWidget(self.parts)
        layout.addWidget(self.skipped)
        layout.addWidget(self.buttons)
        frame = 2 * self.parts.frameWidth()
        self.parts.setFixedHeight(self.parts.verticalHeader().length() + self.parts.horizontalHeader().height() + frame)
        self.resize(1000, 680)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        """The rows' heights once the columns have their real widths (the stretch column's is known only now)."""
        super().showEvent(event)
        QTimer.singleShot(0, self.steps.resizeRowsToContents)

    def apply(self) -> None:
        """Every change into the draft (dotted keys), then close."""
        for key, value in self.plan.changes().items():
            self._state.set(key, value)
        self.accept()
