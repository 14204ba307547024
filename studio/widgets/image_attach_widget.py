"""ImageAttachWidget: the images waiting to go with the next chat message, and the button that picks them.

Only a vision-language run's models read images, so the page turns it on for such a run alone (the button
says why it is off otherwise). The waiting images show as thumbnails read by Qt (thumbnail.py: no Pillow);
Send takes them, and the ✕ drops them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtGui import QPixmap
from PySide6.QtWidgets import QFileDialog, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

from backend.core.data.images import ImageRef
from studio.widgets.thumbnail import thumbnail

CHIP = 40
"""A waiting image's thumbnail side, in pixels."""
FILTER = "Images (*.png *.jpg *.jpeg *.webp *.bmp *.gif *.tif *.tiff)"
OFF = "This run's model reads no images (attach works for a vision-language model's run)"


class ImageAttachWidget(QWidget):
    """The "Image…" button, the waiting images' thumbnails and the ✕ that drops them."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.paths: list[str] = []
        self.pick_files: Callable[[], list[str]] = self._ask_files
        """The file picker; tests replace it."""
        self.button = QPushButton("Image…")
        self.button.clicked.connect(self.pick)
        self.chips = QHBoxLayout()
        self.chips.setContentsMargins(0, 0, 0, 0)
        self.clear_button = QToolButton()
        self.clear_button.setText("✕")
        self.clear_button.setToolTip("Do not send these images")
        self.clear_button.clicked.connect(self.clear)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.button)
        layout.addLayout(self.chips)
        layout.addWidget(self.clear_button)
        self.set_allowed(False)

    def set_allowed(self, allowed: bool) -> None:
        """On for a vision-language run; off drops what was waiting."""
        self.button.setEnabled(allowed)
        self.button.setToolTip("Attach an image to the next message (or drop one on the message box)" if allowed
                               else OFF)
        if not allowed:
            self.clear()

    @property
    def allowed(self) -> bool:
        return self.button.isEnabled()

    def pick(self) -> None:
        self.attach(self.pick_files())

    def attach(self, paths: list[str]) -> None:
        if not self.allowed:
            return
        for path in paths:
            if path and path not in self.paths:
                self.paths.append(str(Path(path).absolute()))
        self._show()

    def take(self) -> list[str]:
        """The waiting images, handed to a message: the row empties."""
        taken, self.paths = self.paths, []
        self._show()
        return taken

    def clear(self) -> None:
        self.paths = []
        self._show()

    def _show(self) -> None:
        while self.chips.count():
            item = self.chips.takeAt(0)
            if item.widget():
                item.widget().deleteLater()
        for path in self.paths:
            chip = QLabel()
            chip.setPixmap(QPixmap.fromImage(thumbnail(ImageRef(path, path=Path(path)), CHIP)))
            chip.setToolTip(path)
            self.chips.addWidget(chip)
        self.clear_button.setVisible(bool(self.paths))
        self.changed.emit()

    def _ask_files(self) -> list[str]:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", "", FILTER)
        return list(paths)
