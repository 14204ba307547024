"""VisionFactsWidget: the Model page's box for a vision-language model folder: its family, vision tower,
projector, the image tokens one image costs at the configured resolution, and the parameters of each part.

Hidden for a text model. The parts are counted on the meta device in a subprocess (backend/api/vision.py),
seconds on a CPU, so the count arrives through a BackgroundCall and the box says so meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QWidget

from backend.api.vision import image_tokens_line, part_counts
from backend.core.vision_folder import VisionFolder
from studio.services.background_call import BackgroundCall
from studio.widgets.units import human_count

ROWS = (("family", "Family"), ("tower", "Vision tower"), ("projector", "Projector"),
        ("tokens", "Image tokens"), ("parts", "Parameters"))


class VisionFactsWidget(QGroupBox):
    """`show(folder, vision)` fills the rows and asks for the part counts; a newer folder supersedes."""

    def __init__(self, parent: QWidget | None = None, synchronous: bool = False) -> None:
        super().__init__("Vision-language model", parent)
        self.values: dict[str, QLabel] = {}
        rows = QFormLayout(self)
        for key, label in ROWS:
            value = QLabel("—")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.values[key] = value
            rows.addRow(label, value)
        self.counter = BackgroundCall(self, synchronous=synchronous)
        self.counter.finished.connect(self._on_counter_finished)
        self.counter.failed.connect(self._on_counter_failed)
        self.parts: dict[str, int] = {}
        self.setVisible(False)

    def show_folder(self, folder: Path | None, vision: VisionFolder) -> None:
        """Show `vision` (a proven family's facts), or hide the box for a text model or a refused family."""
        self.parts = {}
        if folder is None or not vision.is_vlm or vision.family is None:
            for value in self.values.values():
                value.setText("—")
            self.setVisible(False)
            return
        v = self.values
        token_id = vision.family.image_token_id(vision.config)
        token = vision.family.image_token or "the tokenizer's image_token"
        v["family"].setText(f"{vision.family.label} ({vision.model_type}); image token {token}"
                            + (f" = {token_id}" if token_id is not None else ""))
        v["tower"].setText(vision.tower_line() or "—")
        v["projector"].setText(vision.projector_line())
        try:
            v["tokens"].setText(image_tokens_line(vision))
        except ValueError as exc:  # a processor setting the family's rule refuses (a Gemma 4 budget)
            v["tokens"].setText(f"not counted: {exc}")
        v["tokens"].setToolTip("\n".join(vision.family.notes))
        v["parts"].setText("counting on the meta device…")
        self.setVisible(True)
        self.counter.call(lambda: part_counts(folder))

    def _on_counter_finished(self, parts: dict[str, int]) -> None:
        self.parts = dict(parts)
        total = sum(parts.values())
        words = [f"{name} {human_count(count)}" for name, count in parts.items()]
        self.values["parts"].setText(" · ".join(words) + f"  (total {human_count(total)}, {total:,})")

    def _on_counter_failed(self, error: str) -> None:
        self.values["parts"].setText(f"not counted: {error}")
