"""ColumnFlowWidget: boxes in two columns where the width allows, in one column where it does not.

A form of many group boxes side by side needs a wide window; squeezed into a narrow one it gets a
horizontal scroll bar and cut fields. This widget puts each box in its column (the two-column
arrangement) when every column fits at its minimum width, and stacks them all, in the order they
were added, otherwise; inside a vertical scroll area that leaves only a vertical scroll bar. Its
minimum width is the one-column arrangement's, so a scroll area may always narrow it. A box added
with `column=None` goes, in two columns, to whichever column is shorter then, the tallest free box
first (a tall DPO/KTO/GRPO section on the left sends the boxes after it to the right), so the page
scrolls less.
"""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget


SPACING = 3
"""Between boxes in a column: their frames already part them, and every pixel is a row less to scroll."""


class ColumnFlowWidget(QWidget):
    """`add(box, column)` in reading order; the layout picks one or two columns from the width it gets."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._boxes: list[tuple[QWidget, int | None]] = []
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._columns = [QVBoxLayout(), QVBoxLayout()]
        for column in self._columns:
            column.setSpacing(SPACING)
            column.addStretch(1)
            self._row.addLayout(column, 1)
        self.column_count = 2
        """How many columns the boxes are in now (1 or 2)."""

    def add(self, box: QWidget, column: int | None) -> None:
        """Append `box`; it goes to `column` (0 or 1; None: the shorter one) when there are two columns."""
        self._boxes.append((box, column))
        self._place()

    def two_column_width(self) -> int:
        """The narrowest width at which both columns show every box at its minimum width."""
        widths = [0, 0]
        for box, column in self._boxes:
            if not box.isHidden():
                for index in ((0, 1) if column is None else (column,)):
                    widths[index] = max(widths[index], box.minimumSizeHint().width(), box.minimumWidth())
        margins = self._row.contentsMargins()
        return sum(widths) + self._row.spacing() + margins.left() + margins.right()

    def one_column_width(self) -> int:
        margins = self._row.contentsMargins()
        widest = max((max(box.minimumSizeHint().width(), box.minimumWidth())
                      for box, _ in self._boxes if not box.isHidden()), default=0)
        return widest + margins.left() + margins.right()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """As narrow as one column, so an enclosing scroll area narrows it instead of scrolling sideways."""
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.one_column_width()), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        wanted = 2 if event.size().width() >= self.two_column_width() else 1
        if wanted != self.column_count:
            self.column_count = wanted
            self._place()

    def reflow(self) -> None:
        """Boxes changed height (rows shown or hidden): choose the free boxes' columns again."""
        if any(column is None for _, column in self._boxes):
            self._place()

    @staticmethod
    def _two_column_order(item: tuple[QWidget, int | None]) -> tuple[bool, int]:
        """The fixed boxes first, then the free ones tallest first: the greedy split that leaves the
        columns closest in height (the shorter column takes each in turn)."""
        box, column = item
        return column is None, -box.sizeHint().height() if column is None and not box.isHidden() else 0

    def _place(self) -> None:
        """Move every box to its column: its own with two columns, the first in reading order with one."""
        for column in self._columns:
            for box, _ in self._boxes:
                column.removeWidget(box)
        heights = [0, 0]
        order = self._boxes if self.column_count == 1 else \
            sorted(self._boxes, key=self._two_column_order)
        for box, column in order:
            if self.column_count == 1:
                column = 0
            elif column is None:
                column = 0 if heights[0] <= heights[1] else 1
            if not box.isHidden():
                heights[column] += box.sizeHint().height()
            target = self._columns[column]
            target.insertWidget(target.count() - 1, box)  # before the stretch
        self._row.setStretch(1, 1 if self.column_count == 2 else 0)
        self.updateGeometry()
