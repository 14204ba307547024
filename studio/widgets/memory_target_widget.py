"""MemoryTargetWidget: which memory the run is for (this machine, a common card, a custom size), and
Make it fit when the estimate does not fit it.

A person often plans a run for a card they do not have here, as `finetune-studio estimate --card-gb`
does; the estimate, "Longest that fits" and the fits verdict then follow that card's usable memory.
"""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSpinBox, QWidget

from backend.api.estimates import CARD_SIZES_GB
from studio.state.config_state import ConfigState
from studio.state.estimate_state import EstimateState
from studio.widgets.fit_dialog import FitDialog

MACHINE, CUSTOM = "This machine", "Custom size"
"""The picker's first and last items (the cards between them)."""


class MemoryTargetWidget(QWidget):
    """The picker (sets EstimateState.set_card) and the Make it fit button (opens a FitDialog)."""

    def __init__(self, estimate: EstimateState, state: ConfigState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._estimate, self._state = estimate, state
        self.picker = QComboBox()
        self.picker.addItem(MACHINE, None)
        for gb in CARD_SIZES_GB:
            self.picker.addItem(f"{gb} GB card", gb)
        self.picker.addItem(CUSTOM, 0)
        self.picker.setToolTip("The memory the run is for: this machine's GPU (or RAM without one), or a CUDA card "
                               "of a common size at its usable memory (a card gives a program a bit less than "
                               "its nominal size; backend/estimate/cards.py).")
        self.custom = QSpinBox()
        self.custom.setRange(1, 4096)
        self.custom.setValue(24)
        self.custom.setSuffix(" GB")
        self.custom.setToolTip("A card of this nominal size, at the same usable share as the common sizes.")
        self.custom.setVisible(False)
        self.fit_button = QPushButton("Make it fit…")
        self.fit_button.setToolTip("The changes that bring the estimate under this memory, least speed lost first, "
                                   "each with its speed cost; applied in one click.")
        self.fit_button.setVisible(False)
        self.dialog: FitDialog | None = None
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("For:"))
        layout.addWidget(self.picker)
        layout.addWidget(self.custom)
        layout.addStretch(1)
        layout.addWidget(self.fit_button)
        self.picker.currentIndexChanged.connect(self._on_picked)
        self.custom.valueChanged.connect(self._on_picked)
        self.fit_button.clicked.connect(self.open_fit)
        estimate.changed.connect(self._on_estimate_changed)
        self._on_estimate_changed()

    def choose(self, card_gb: int | None) -> None:
        """Pick a common card (None: this machine; another size: the custom one)."""
        index = self.picker.findData(card_gb) if card_gb is None or card_gb in CARD_SIZES_GB else -1
        if index < 0:
            self.custom.setValue(int(card_gb or 1))
            index = self.picker.count() - 1
        self.picker.setCurrentIndex(index)
        self._on_picked()

    def _on_picked(self) -> None:
        data = self.picker.currentData()
        self.custom.setVisible(data == 0)
        self._estimate.set_card(self.custom.value() if data == 0 else data)

    def _on_estimate_changed(self) -> None:
        self.fit_button.setVisible(self._estimate.verdict() == "too_big")

    def open_fit(self) -> None:
        """Work out the plan for the draft now and show it (window-modal)."""
        plan = self._estimate.fit_plan()
        if plan is None:
            return
        self.dialog = FitDialog(plan, self._state, self)
        self.dialog.open()
