"""Render the app icon (app.svg) to PNGs at the sizes desktops ask for: 16 to 256 px.

    python resources/icons/make_icons.py

Writes resources/icons/app-<size>.png next to this script. Uses Qt's own SVG renderer (QtSvg), so it
needs nothing beyond PySide6 and runs without a display (the offscreen platform is used when no
display is set). Rerun after editing app.svg; the PNGs are committed so packaging needs no Qt step.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = (16, 32, 48, 64, 128, 256)


def render(svg: Path, size: int, out: Path) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter)
    painter.end()
    if not image.save(str(out), "PNG"):
        raise SystemExit(f"could not write {out}")


def main() -> int:
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (Qt needs it alive)
    for size in SIZES:
        out = HERE / f"app-{size}.png"
        render(HERE / "app.svg", size, out)
        print(f"wrote {out.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
