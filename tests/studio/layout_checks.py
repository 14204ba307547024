"""Layout faults a person sees at a small window size, found in a shown page (the screenshot tour runs them).

Each check returns one sentence per fault, so a failing run says which widget on which page is wrong:
- a horizontal scroll bar (the page is wider than the window), or content cut at the right;
- a widget drawn smaller than its minimum (text cut, rows drawn over each other);
- a combo box narrower than its longest item;
- two rows of a form drawn over each other.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QComboBox,
    QFormLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QWidget,
)

SLACK = 1
"""Pixels of rounding forgiven in a width comparison."""
HEIGHT_SLACK = 3
"""Pixels forgiven in a height comparison: a form row with a wrapped label may come out a frame's
width short of its minimum (Qt's height-for-width rounding) with nothing cut; cut text loses more."""


def describe(widget: QWidget) -> str:
    """A name a person can find the widget by: its class, object name or text."""
    text = ""
    if isinstance(widget, QLabel):
        text = widget.text()
    elif isinstance(widget, QComboBox):
        text = widget.currentText()
    elif hasattr(widget, "title") and callable(widget.title):
        text = widget.title()
    name = widget.objectName()
    bits = [type(widget).__name__] + ([name] if name and not name.startswith("qt_") else [])
    return " ".join(bits) + (f" {text[:40]!r}" if text else "")


def _shown(page: QWidget, kind: type) -> list:
    return [w for w in page.findChildren(kind) if w.isVisible() and w.width() > 0]


def horizontal_scrollbars(page: QWidget) -> list[str]:
    """Every scroll area on the page that shows a horizontal scroll bar."""
    return [f"{describe(area)} shows a horizontal scroll bar"
            for area in _shown(page, QAbstractScrollArea) if area.horizontalScrollBar().isVisible()]


def cut_scroll_contents(page: QWidget) -> list[str]:
    """Scroll areas whose content is wider than what they show, with no bar to reach the rest."""
    return [f"{describe(area)} cuts {area.widget().width() - area.viewport().width()} px of its content"
            for area in _shown(page, QScrollArea)
            if area.widget() is not None and area.widget().width() > area.viewport().width() + SLACK
            and not area.horizontalScrollBar().isVisible()]


def _needed_height(widget: QWidget) -> int:
    if isinstance(widget, QLabel) and widget.wordWrap() and widget.text():
        return widget.heightForWidth(widget.width())
    return widget.minimumSizeHint().height()


def squeezed(page: QWidget) -> list[str]:
    """Widgets drawn smaller than they need: their text is cut or drawn over the next widget.

    Scroll areas are left out (showing part of their content is what they are for), and so is
    anything whose size policy says it may be drawn at any size.
    """
    problems = []
    for widget in _shown(page, QWidget):
        if widget.isWindow() or isinstance(widget, QAbstractScrollArea) or widget.inherits("QScrollBar"):
            continue
        parent = widget.parent()
        if parent is not None and (parent.inherits("QAbstractScrollArea") or parent.inherits("QAbstractSpinBox")
                                   or parent.inherits("QComboBox")):
            continue  # a scroll area's own viewport, bars and headers; a spin box's or combo's line edit
        policy = widget.sizePolicy()
        if policy.verticalPolicy() != QSizePolicy.Policy.Ignored:
            need = _needed_height(widget)
            if need > 0 and widget.height() + HEIGHT_SLACK < need:
                problems.append(f"{describe(widget)} is {widget.height()} px high, needs {need}")
        if policy.horizontalPolicy() != QSizePolicy.Policy.Ignored and not (
                isinstance(widget, QLabel) and widget.wordWrap()):
            need = widget.minimumSizeHint().width()
            if need > 0 and widget.width() + SLACK < need:
                problems.append(f"{describe(widget)} is {widget.width()} px wide, needs {need}")
    return problems


def narrow_combos(page: QWidget) -> list[str]:
    """Combo boxes too narrow to show their longest item (sizeHint covers every item's text)."""
    return [f"{describe(combo)} is {combo.width()} px wide, its items need {combo.sizeHint().width()}"
            for combo in _shown(page, QComboBox) if combo.width() + SLACK < combo.sizeHint().width()]


def overlapping_rows(form: QFormLayout) -> list[str]:
    """Rows of a form layout whose widgets are drawn over each other (or cut to less than one line)."""
    problems, cells = [], []
    for row in range(form.rowCount()):
        for role in (QFormLayout.ItemRole.LabelRole, QFormLayout.ItemRole.FieldRole):
            item = form.itemAt(row, role)
            widget = item.widget() if item is not None else None
            if widget is not None and widget.isVisible():
                cells.append(widget)
                if widget.height() + SLACK < widget.sizeHint().height():
                    problems.append(f"{describe(widget)} is cut to {widget.height()} px of "
                                    f"{widget.sizeHint().height()}")
    for index, first in enumerate(cells):
        for second in cells[index + 1:]:
            if first.geometry().intersects(second.geometry()):
                problems.append(f"{describe(first)} overlaps {describe(second)}")
    return problems


def page_problems(page: QWidget) -> list[str]:
    """Every check above that applies to any page."""
    return horizontal_scrollbars(page) + cut_scroll_contents(page) + squeezed(page) + narrow_combos(page)
