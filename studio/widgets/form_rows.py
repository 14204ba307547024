"""The Techniques page's form rows: dense group boxes, and two editors side by side in one row.

About thirty rows a column have to fit a 1280x800 screen unscrolled (GRPO's settings included), so the
page's group boxes are tighter than Fusion's default and a few related fields share a row.
"""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QHBoxLayout, QLabel, QLayout, QWidget

ROW_SPACING = 2
"""Between a form's rows (Fusion's default is 6): with GRPO's settings the page then fits 1280x800 unscrolled."""


def dense(form: QLayout) -> None:
    """Tighter rows and margins for one of the page's group boxes (about 30 rows a column at 1280x800)."""
    if isinstance(form, QFormLayout):
        form.setVerticalSpacing(ROW_SPACING)
    else:  # a box whose form sits in a column with other widgets (Hardware)
        form.setSpacing(ROW_SPACING)
        for index in range(form.count()):
            inner = form.itemAt(index).layout()
            if isinstance(inner, QFormLayout):
                inner.setVerticalSpacing(ROW_SPACING)
    margins = form.contentsMargins()
    form.setContentsMargins(margins.left(), max(margins.top() - 5, 2), margins.right(), max(margins.bottom() - 5, 2))


def pair_row(first: QWidget, joiner: str, second: QWidget) -> QWidget:
    """Two editors side by side in one form row: "first or second"."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(4)
    layout.addWidget(first, 1)
    layout.addWidget(QLabel(joiner))
    layout.addWidget(second, 1)
    return row


def beside_row(first: QWidget, label: QLabel, second: QWidget) -> QWidget:
    """A check box, then another with its label, in one form row."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(6)
    for box in (first, second):
        box.setMinimumWidth(0)  # a check box needs no editor's width
    layout.addWidget(first)
    layout.addSpacing(18)
    layout.addWidget(label)
    layout.addWidget(second)
    layout.addStretch(1)
    return row
