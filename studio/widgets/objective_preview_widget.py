"""ObjectivePreviewWidget: the first records of DPO, KTO or GRPO data, their fields side by side.

A pair is judged by reading the chosen and the rejected answer next to each other, so each field is
a column (prompt, chosen, rejected; prompt, completion, label; prompt and the columns the rewards
read), each record a row, long text wrapped and shown whole in the cell's tooltip.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from backend.api.previews import ObjectiveRecords

CELL_CHARS = 300
"""Characters shown in a cell (the tooltip holds all of it)."""
HEADERS = {"prompt": "Prompt", "chosen": "Chosen ✓", "rejected": "Rejected ✗", "completion": "Completion",
           "label": "Label"}


def readable(text: str, special: tuple[str, ...]) -> str:
    """A templated cell as a person reads it: the special tokens (<|bos|>, <|user|>) left out, like the
    SFT preview's conversations; the tooltip keeps the text as the model reads it."""
    if not special:
        return text
    for token in special:
        text = text.replace(token, "")
    return text.strip()


class ObjectivePreviewWidget(QTableWidget):
    """`set_records(records)` shows its columns and rows (nothing for a refused file)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 0, parent)
        self.setWordWrap(True)
        self.setAlternatingRowColors(True)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)

    def set_records(self, records: ObjectiveRecords | None) -> None:
        columns = list(records.columns) if records is not None and not records.problem else []
        rows = list(records.rows) if columns else []
        self.clear()
        self.setColumnCount(len(columns))
        self.setRowCount(len(rows))
        self.setHorizontalHeaderLabels([HEADERS.get(name, name) for name in columns])
        header = self.horizontalHeader()
        for column, name in enumerate(columns):
            mode = QHeaderView.ResizeMode.ResizeToContents if name == "label" else QHeaderView.ResizeMode.Stretch
            header.setSectionResizeMode(column, mode)
        for row, record in enumerate(rows):
            for column, name in enumerate(columns):
                raw = record.get(name, "")
                text = readable(raw, records.special)
                item = QTableWidgetItem(text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…")
                item.setToolTip(f"As the model reads it:\n{raw}" if text != raw else raw)
                item.setTextAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
                self.setItem(row, column, item)

    def cell_text(self, row: int, column: str) -> str:
        """The text shown under a field's column (tests read it)."""
        names = [self.horizontalHeaderItem(c).text() for c in range(self.columnCount())]
        item = self.item(row, names.index(HEADERS.get(column, column)))
        return item.text() if item is not None else ""
