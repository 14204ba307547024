"""CompletionListWidget: GRPO's latest sampled completions with what each reward function gave them.

Seeing what the model writes, and how the rewards score it, is how a person notices a reward that
is gamed (a regex satisfied by junk) or never earned. Fed by the run's ObjectiveStore
(CompletionScored events), newest first, at most MAX_COMPLETIONS rows so a long run stays light.
"""

from __future__ import annotations

from PySide6.QtGui import QColor
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from backend.core.protocol import CompletionScored
from studio.state.objective_store import MAX_COMPLETIONS, ObjectiveStore


NEWLINE = "⏎"
"""Shown where a completion breaks its line: a reward that checks lines must see them in one row."""


def _one_line(text: str, width: int) -> str:
    """The text in one row: each line break shown as NEWLINE (not joined with a space), runs of spaces one."""
    flat = f" {NEWLINE} ".join(" ".join(line.split()) for line in text.strip().splitlines())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def completion_text(event: CompletionScored) -> str:
    """"step 3 · reward 0.75 (exact_match 1, length 0.5): completion" (the prompt is in the tooltip)."""
    scores = ", ".join(f"{label} {value:.2g}" for label, value in event.rewards.items())
    parts = f" ({scores})" if scores else ""
    answer = _one_line(event.completion, 160) if event.completion.strip() else "(empty)"
    return f"step {event.step} · reward {event.reward:.3g}{parts}: {answer}"


class CompletionListWidget(QListWidget):
    """One row per completion, newest first; red where it earned no reward."""

    def __init__(self, store: ObjectiveStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setAlternatingRowColors(True)
        self.setToolTip("The newest completions GRPO sampled, with each reward function's score and their "
                        "weighted sum (what a completion is ranked by within its prompt's group)")
        store.completion_added.connect(self.add)
        store.cleared.connect(self.clear)
        for event in store.completions:
            self.add(event)

    def add(self, event: CompletionScored) -> None:
        item = QListWidgetItem(completion_text(event))
        item.setToolTip(f"Prompt:\n{event.prompt}\n\nCompletion:\n{event.completion}")
        if event.reward <= 0:
            item.setForeground(QColor("#dc2626"))
        self.insertItem(0, item)
        while self.count() > MAX_COMPLETIONS:
            self.takeItem(self.count() - 1)

    def rows(self) -> list[str]:
        return [self.item(i).text() for i in range(self.count())]
