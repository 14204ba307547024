"""PageHeaderWidget: the title and one-sentence guide at the top of every page."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget


class PageHeaderWidget(QWidget):
    """A bold title and a muted sentence saying what this step is for."""

    def __init__(self, title: str, guide: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QLabel(title)
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.35)
        font.setBold(True)
        self.title.setFont(font)
        self.guide = QLabel(guide)
        self.guide.setWordWrap(True)
        self.guide.setStyleSheet("color: palette(placeholder-text);")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.setSpacing(2)
        layout.addWidget(self.title)
        layout.addWidget(self.guide)
