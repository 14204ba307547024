"""Settings: what the studio remembers between sessions (QSettings).

The last model and dataset, the window's geometry and dock layout, the page that was open and the
theme. Stored where Qt stores an application's settings (~/.config/finetune-studio/ on Linux);
when FINETUNE_STUDIO_HOME is set (tests, benchmarks, a portable install) they live in
`$FINETUNE_STUDIO_HOME/studio.ini` instead, so such a run never reads or changes the user's.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings
from PySide6.QtWidgets import QMainWindow

THEMES = ("system", "light", "dark")


class Settings:
    """Typed accessors over one QSettings store."""

    def __init__(self, store: QSettings | None = None) -> None:
        if store is None:
            home = os.environ.get("FINETUNE_STUDIO_HOME")
            if home:
                Path(home).mkdir(parents=True, exist_ok=True)
                store = QSettings(str(Path(home) / "studio.ini"), QSettings.Format.IniFormat)
            else:
                store = QSettings("finetune-studio", "Finetune Studio")
        self.store = store

    # --- paths --------------------------------------------------------------------------------
    @property
    def last_model(self) -> str:
        return str(self.store.value("paths/model", "") or "")

    @last_model.setter
    def last_model(self, value: str) -> None:
        self.store.setValue("paths/model", value)

    @property
    def last_dataset(self) -> str:
        return str(self.store.value("paths/dataset", "") or "")

    @last_dataset.setter
    def last_dataset(self, value: str) -> None:
        self.store.setValue("paths/dataset", value)

    # --- look ---------------------------------------------------------------------------------
    @property
    def theme(self) -> str:
        value = str(self.store.value("ui/theme", "system") or "system")
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        self.store.setValue("ui/theme", value if value in THEMES else "system")

    @property
    def page(self) -> int:
        try:
            return int(self.store.value("ui/page", 0))
        except (TypeError, ValueError):
            return 0

    @page.setter
    def page(self, value: int) -> None:
        self.store.setValue("ui/page", int(value))

    # --- window -------------------------------------------------------------------------------
    def save_window(self, window: QMainWindow) -> None:
        self.store.setValue("window/geometry", window.saveGeometry())
        self.store.setValue("window/state", window.saveState())

    def restore_window(self, window: QMainWindow) -> bool:
        """Put the window back where it was; False when nothing was saved yet."""
        geometry = self.store.value("window/geometry")
        state = self.store.value("window/state")
        restored = isinstance(geometry, QByteArray) and window.restoreGeometry(geometry)
        if isinstance(state, QByteArray):
            window.restoreState(state)
        return bool(restored)

    def sync(self) -> None:
        self.store.sync()
