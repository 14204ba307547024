"""open_folder: show a folder in the file manager, or say why not, so a click never fails silently.

QDesktopServices.openUrl returns False when nothing on the desktop can open a folder (a bare window
manager, no xdg-open); the page then shows the path itself, as selectable text to copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QUrl


def open_folder(open_url: Callable[[QUrl], object], path: str | Path) -> str:
    """Ask `open_url` to open `path`; "" when it did, else the sentence for the page's status line."""
    if open_url(QUrl.fromLocalFile(str(path))) is False:  # None (a stand-in that returns nothing) is no failure
        return f"No file manager could open the folder; here is its path to copy: {path}"
    return ""
