"""MessageEdit: the Chat page's message line, which also takes image files dropped onto it.

A drop of files Qt can read as images (QImageReader looks at their content, not only the name) is handed on
as `images_dropped(paths)` while `accepts_images` is on (a vision-language run); any other drop, text
included, is the line edit's own.
"""

from __future__ import annotations

from PySide6.QtCore import QMimeData, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QImageReader
from PySide6.QtWidgets import QLineEdit, QWidget


def image_files(mime: QMimeData) -> list[str]:
    """The local files of a drag whose content Qt reads as an image, in the order dragged."""
    if not mime.hasUrls():
        return []
    paths = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()]
    return [path for path in paths if path and QImageReader.imageFormat(path)]


class MessageEdit(QLineEdit):
    """A QLineEdit that turns dropped image files into `images_dropped`."""

    images_dropped = Signal(list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.accepts_images = False
        """On for a vision-language run: dropped images are attached to the next message."""
        self.setAcceptDrops(True)

    def _wanted(self, mime: QMimeData) -> list[str]:
        return image_files(mime) if self.accepts_images else []

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        if self._wanted(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:  # noqa: N802 (Qt override)
        if self._wanted(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        paths = self._wanted(event.mimeData())
        if paths:
            event.acceptProposedAction()
            self.images_dropped.emit(paths)
        else:
            super().dropEvent(event)
