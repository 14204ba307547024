"""SampleListWidget: the answers the model gave to a few prompts during training, newest first.

The worker samples after each evaluation: PhaseChanged(phase="sample", detail=prompt), then
TokensGenerated(done=True) with the answer, for every objective (SFT, DPO, KTO, GRPO). Feed every
event to `apply`; others are ignored. While empty it says when samples come, and why a run may have none.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter, QPaintEvent, QPalette
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from backend.core.protocol import JobStarted, PhaseChanged, TokensGenerated

MAX_SAMPLES = 50
EMPTY = ("Answers to a few validation prompts appear after each evaluation. A run without a validation "
         "split (data.validation_split 0) or evaluations (train.eval_steps 0) has none.")


class SampleListWidget(QListWidget):
    """One row per sample: "step N · prompt → answer"."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setAlternatingRowColors(True)
        self.setToolTip("Sample answers generated after each evaluation")
        self._prompt: str | None = None
        self._step = 0

    def apply(self, event: Any) -> None:
        if isinstance(event, JobStarted) and getattr(event, "job", "finetune") == "finetune" and not event.resumed_from:
            self.clear()
        elif isinstance(event, PhaseChanged):
            self._prompt = event.detail if event.phase == "sample" else None
        elif isinstance(event, TokensGenerated) and event.done and self._prompt is not None:
            text = f"{self._prompt.strip()}  →  {event.text.strip() or '(empty)'}"
            self.insertItem(0, QListWidgetItem(text))
            while self.count() > MAX_SAMPLES:
                self.takeItem(self.count() - 1)
            self._prompt = None

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt override)
        super().paintEvent(event)
        if self.count() == 0:  # a list has no placeholder: say, wrapped, when samples come
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(self.viewport().rect().adjusted(6, 6, -6, -6),
                             Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap, EMPTY)
            painter.end()

    def samples(self) -> list[str]:
        return [self.item(i).text() for i in range(self.count())]
