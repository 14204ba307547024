"""PresetPickerWidget: the Model page's "Start from a preset": the presets that fit a card size.

The card filter starts at the GPU the monitor found (its memory, rounded down to a common card
size) so that a person sees first the presets sized for their machine; every preset stays
reachable by picking a larger card or "Any card".
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from backend.api.presets import Preset, list_presets

CARD_SIZES = (8, 12, 16, 24, 48, 80, 160)
"""Card filters in GB of GPU memory (160: two 80 GB cards)."""
GIB = 1024**3


class PresetPickerWidget(QWidget):
    """A card-size filter, the presets that fit it, what the chosen one is for, and Use."""

    chosen = Signal(Path)
    """The preset file the person asked to start from."""

    def __init__(self, presets: list[Preset] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.presets = presets if presets is not None else list_presets()
        self.loaded = ""
        """The preset file the draft was loaded from ("" for none): shown first, and kept by the card filter."""
        self.card = QComboBox()
        self.card.addItem("Any card", 0)
        for size in CARD_SIZES:
            self.card.addItem("2x80 GB" if size == 160 else f"{size} GB", size)
        self.card.setToolTip("GPU memory of your card: the list shows the presets sized for it or smaller")
        self.card.currentIndexChanged.connect(self._refill)
        self.list = QComboBox()
        self.list.setPlaceholderText("Not a preset: the setup comes from a file")
        self.list.currentIndexChanged.connect(self._describe)
        self.use = QPushButton("Use this preset")
        self.use.clicked.connect(self._on_use_clicked)
        self.about = QLabel()
        self.about.setWordWrap(True)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Card"))
        row.addWidget(self.card)
        row.addWidget(self.list, 1)
        row.addWidget(self.use)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.about)
        self._refill()

    def set_card_memory(self, total_bytes: int) -> None:
        """Filter to the largest common card size this GPU's memory reaches (a 24 GiB card: 24 GB), and
        suggest the largest preset sized for it (the list runs from the smallest card up)."""
        gib = total_bytes / GIB
        fitting = [size for size in CARD_SIZES[:-1] if size <= gib + 0.5]
        if fitting:
            self.card.setCurrentIndex(self.card.findData(fitting[-1]))
            if not self.from_file() and (not self.loaded or self.list.currentData() != self.loaded):
                self.list.setCurrentIndex(self.list.count() - 1)

    def show_loaded(self, path: object) -> None:
        """Show the preset the draft was loaded from (not whichever sorts first); none for a file that is
        not a preset (File > Open config), so Use never names a preset the draft did not come from."""
        self.loaded = str(path) if path else ""
        index = self.list.findData(self.loaded) if self.loaded else -1
        if index < 0 and self.loaded and any(str(p.path) == self.loaded for p in self.presets):
            self.card.setCurrentIndex(0)  # filtered out by the card size: show every card
            index = self.list.findData(self.loaded)
        if index >= 0 or self.from_file():
            self.list.setCurrentIndex(index)  # -1 for a file that is no preset: none shown

    def from_file(self) -> bool:
        """Whether the draft was loaded from a file that is not one of the presets."""
        return bool(self.loaded) and all(str(p.path) != self.loaded for p in self.presets)

    def shown(self) -> list[Preset]:
        limit = self.card.currentData() or 0
        return [p for p in self.presets if not limit or p.card_gb * p.cards <= limit]

    def _refill(self) -> None:
        current = self.list.currentData()
        self.list.blockSignals(True)
        self.list.clear()
        for preset in self.shown():
            self.list.addItem(f"{preset.title}  ·  {preset.card_label}", str(preset.path))
        index = self.list.findData(current)
        self.list.setCurrentIndex(index if index >= 0 or (current is None and self.from_file()) else 0)
        self.list.blockSignals(False)
        self._describe()

    def selected(self) -> Preset | None:
        path = self.list.currentData()
        return next((p for p in self.presets if str(p.path) == path), None)

    def _describe(self) -> None:
        preset = self.selected()
        self.use.setEnabled(preset is not None)
        if preset is None and self.list.count():
            self.about.setText(f"The setup comes from {Path(self.loaded).name or 'the defaults'}, not a preset: "
                               "choose one to start over from it.")
            self.about.setToolTip(self.loaded)
            return
        if preset is None:
            self.about.setText("No preset is sized for a card this small; pick a larger card or Any card.")
            return
        model = f"Model: {preset.hub_id}. " if preset.hub_id else ""
        sentences = (text[:1].upper() + text[1:] for text in (preset.when, preset.cost) if text)
        self.about.setText(f"{model}{' '.join(sentences)}".strip())
        self.about.setToolTip(str(preset.path))

    def _on_use_clicked(self) -> None:
        preset = self.selected()
        if preset is not None:
            self.chosen.emit(preset.path)
