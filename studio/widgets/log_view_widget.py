"""LogViewWidget: the log pane, which keeps following new lines while its end is in view.

QPlainTextEdit follows only while its scroll bar sits at the very end; a viewport that shrinks (the
window or the dock resized) adds range above the value and the pane stopped following for good.
Here "following" is the person's choice: scrolling up stops it, scrolling back to the end resumes it,
and a resize or trimmed old lines never change it.
"""

from __future__ import annotations

from PySide6.QtWidgets import QPlainTextEdit, QWidget


class LogViewWidget(QPlainTextEdit):
    """A read-only plain-text log, at most `max_lines` lines, following its end unless scrolled up."""

    def __init__(self, max_lines: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(max_lines)
        self.following = True
        """Whether new lines scroll into view (False once the person scrolled up from the end)."""
        self._appending = False
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_bar_value_changed)
        bar.rangeChanged.connect(self._on_bar_range_changed)

    def append_line(self, line: str) -> None:
        self._appending = True
        try:
            self.appendPlainText(line)
        finally:
            self._appending = False
        if self.following:
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def _on_bar_value_changed(self, value: int) -> None:
        if not self._appending:
            self.following = value >= self.verticalScrollBar().maximum()

    def _on_bar_range_changed(self, _low: int, high: int) -> None:
        if self.following:
            self.verticalScrollBar().setValue(high)
