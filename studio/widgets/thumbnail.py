"""thumbnail(): a dataset image as a small QImage, read by Qt's own image plugins (no Pillow, no torch).

Qt decodes at the scaled size where the format allows it (JPEG), applies the EXIF orientation, and
refuses what it cannot read with a null image, which the preview shows as a grey tile. The images
reached here already passed the reader's header checks (backend.core.data.images), bombs included.
"""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt
from PySide6.QtGui import QColor, QImage, QImageReader

from backend.core.data.images import ImageRef

SIDE = 72
"""The thumbnail's longer side, in pixels."""


def thumbnail(ref: ImageRef, side: int = SIDE) -> QImage:
    """The image scaled to fit side x side, or a grey tile when Qt cannot read it."""
    if ref.data is not None:
        buffer = QBuffer()
        buffer.setData(QByteArray(ref.data))
        buffer.open(QIODevice.OpenModeFlag.ReadOnly)
        reader = QImageReader(buffer)
    else:
        reader = QImageReader(str(ref.path))
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and size.width() > 0 and size.height() > 0:
        # The stored size, scaled before the EXIF rotation: fitting a square, it fits after it too.
        reader.setScaledSize(size.scaled(QSize(side, side), Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        image = QImage(side, side, QImage.Format.Format_RGB32)
        image.fill(QColor("#9ca3af"))
    return image
