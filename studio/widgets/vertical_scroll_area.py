"""VerticalScrollArea: a page's content that scrolls up and down, never sideways.

A page taller than a small window (1024x700 with the log open) would otherwise squeeze its rows
into each other; in this area it keeps its natural height and scrolls. It is never narrower than
its content's minimum width plus the scroll bar, so nothing is cut at the right either.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget


class VerticalScrollArea(QScrollArea):
    """Holds `content` at the viewport's width and its own height, with only a vertical scroll bar."""

    def __init__(self, content: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(content)
        content.installEventFilter(self)
        self._follow_content_width()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if watched is self.widget() and event.type() == QEvent.Type.LayoutRequest:
            self._follow_content_width()
        return super().eventFilter(watched, event)

    def _follow_content_width(self) -> None:
        """The content's minimum width (it may change: rows shown, text set) plus room for the bar."""
        content = self.widget()
        if content is not None:
            width = content.minimumSizeHint().width() + self.verticalScrollBar().sizeHint().width()
            if width != self.minimumWidth():
                self.setMinimumWidth(width)
