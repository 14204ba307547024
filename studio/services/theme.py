"""Theme: light, dark, or whatever the desktop uses, over Qt's Fusion style.

"system" follows the platform's colour scheme (Qt 6.5+ reports it and signals changes); where the
platform says nothing (offscreen, bare X servers) it stays light. The dark palette is built here
rather than trusted to the platform, so the studio looks the same on every desktop, and
resources/styles/studio.qss adds spacing and check boxes whose edge shows on both themes, reading
its colours from the palette.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from backend.core.paths import resources_dir

STYLE_SHEET = "styles/studio.qss"
STYLES_FOLDER = "@STYLES@"
"""Written in the sheet where an image's folder goes; replaced by the sheet's folder when it is read."""


def dark_palette() -> QPalette:
    p = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    colors = {
        role.Window: "#1f2329", role.WindowText: "#e6e6e6", role.Base: "#16191d", role.AlternateBase: "#23272e",
        role.ToolTipBase: "#2b3038", role.ToolTipText: "#e6e6e6", role.PlaceholderText: "#8b929c",
        role.Text: "#e6e6e6", role.Button: "#2a2f36", role.ButtonText: "#e6e6e6", role.BrightText: "#ff6b6b",
        role.Link: "#60a5fa", role.Highlight: "#2563eb", role.HighlightedText: "#ffffff",
        role.Light: "#3a4049", role.Midlight: "#30353d", role.Mid: "#3f4550", role.Dark: "#121417",
        role.Shadow: "#000000",
    }
    for r, c in colors.items():
        p.setColor(r, QColor(c))
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(group.Disabled, r, QColor("#6b7280"))
    return p


def light_palette() -> QPalette:
    p = QApplication.style().standardPalette()
    p.setColor(QPalette.ColorRole.Highlight, QColor("#2563eb"))
    p.setColor(QPalette.ColorRole.PlaceholderText, QColor("#6b7280"))
    return p


class Theme:
    """Applies a theme name ("system", "light", "dark") and follows the desktop in "system"."""

    def __init__(self, app: QApplication) -> None:
        self.app = app
        self.name = "system"
        if app.style().name().lower() != "fusion":
            app.setStyle("Fusion")
        sheet = resources_dir() / STYLE_SHEET
        try:  # the sheet names its images (the check box's tick) relative to its own folder
            self.sheet = sheet.read_text(encoding="utf-8").replace(STYLES_FOLDER, sheet.parent.as_posix())
        except OSError:
            self.sheet = ""
        hints = QGuiApplication.styleHints()
        if hasattr(hints, "colorSchemeChanged"):
            hints.colorSchemeChanged.connect(self._on_hints_color_scheme_changed)

    def system_is_dark(self) -> bool:
        hints = QGuiApplication.styleHints()
        return hasattr(hints, "colorScheme") and hints.colorScheme() == Qt.ColorScheme.Dark

    def is_dark(self) -> bool:
        return self.name == "dark" or (self.name == "system" and self.system_is_dark())

    def apply(self, name: str) -> None:
        self.name = name if name in ("system", "light", "dark") else "system"
        palette = dark_palette() if self.is_dark() else light_palette()
        if palette == self.app.palette() and self.app.styleSheet() == self.sheet:
            return  # already so: re-polishing every widget would only cost time
        self.app.setPalette(palette)
        # A style sheet resolves palette(...) when it is set, and while one is set widgets keep the
        # palette they were polished with: setting it again re-polishes everything in the new colours.
        self.app.setStyleSheet("")
        self.app.setStyleSheet(self.sheet)

    def _on_hints_color_scheme_changed(self, _scheme: object) -> None:
        if self.name == "system":
            self.apply("system")
