"""FailurePanelWidget: what went wrong with a run and the one click that deals with it.

An out-of-memory names the phase, the measured peak and the predicted one, and offers the worker's
proposed fix ("Apply fix: <hint>"); once applied, "Start again" runs the changed setup. A crash or a
full disk offers Resume when the run left a complete checkpoint. A view only: RecoveryController
decides what the buttons do.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from studio.widgets.units import human_bytes


def failure_text(event: Any) -> str:
    """One or two sentences: the message, then where it failed and the memory figures if known."""
    parts = [event.message.rstrip(".") + "."]
    facts = []
    if getattr(event, "phase", None):
        facts.append(f"phase: {event.phase}")
    if getattr(event, "peak_bytes", None):
        facts.append(f"peak {human_bytes(event.peak_bytes)}")
    if getattr(event, "predicted_bytes", None):
        facts.append(f"predicted {human_bytes(event.predicted_bytes)}")
    if facts:
        parts.append("(" + ", ".join(facts) + ")")
    if getattr(event, "hint", ""):
        parts.append(f"Hint: {event.hint}")
    return " ".join(parts)


class FailurePanelWidget(QFrame):
    """A red-edged box under the run controls; hidden until a run fails."""

    fix_requested = Signal(dict)
    """Emitted with the dotted config overrides of the proposed fix when the person applied it."""
    restart_requested = Signal()
    """Emitted when the person asked to start again (after applying a fix)."""
    resume_requested = Signal()
    """Emitted when the person asked to resume the failed run from its newest complete checkpoint."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("FailurePanel")
        self.setStyleSheet("#FailurePanel { border: 1px solid #dc2626; border-radius: 4px; }")
        self._fix: dict[str, Any] = {}
        self.title = QLabel()
        self.title.setStyleSheet("color: #dc2626; font-weight: bold;")
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.fix_button = QPushButton()
        self.fix_button.clicked.connect(self._on_fix_button_clicked)
        self.restart_button = QPushButton("Start again")
        self.restart_button.clicked.connect(self.restart_requested)
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(self.resume_requested)
        buttons = QHBoxLayout()
        for button in (self.fix_button, self.restart_button, self.resume_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 6)
        layout.addWidget(self.title)
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        self.clear()

    def clear(self) -> None:
        """Hide the panel (a new run started)."""
        self._fix = {}
        self.setVisible(False)

    def show_failure(self, event: Any, checkpoint: str = "") -> None:
        """Show a JobFailed; `checkpoint` names the complete checkpoint Resume would continue from."""
        kind = getattr(event, "kind", "crashed")
        titles = {"out_of_memory": "Out of memory", "disk_full": "The disk is full", "crashed": "The worker crashed"}
        self.title.setText(titles.get(kind, "The run failed"))
        self.message.setText(failure_text(event))
        self._fix = dict(getattr(event, "fix", None) or {}) if kind == "out_of_memory" else {}
        hint = getattr(event, "hint", "") or ", ".join(f"{k} = {v}" for k, v in self._fix.items())
        self.fix_button.setText(f"Apply fix: {hint}")
        self.fix_button.setToolTip("\n".join(f"{k} = {v}" for k, v in self._fix.items()))
        self.fix_button.setVisible(bool(self._fix))
        self.fix_button.setEnabled(True)
        self.restart_button.setVisible(False)
        self.resume_button.setVisible(bool(checkpoint) and kind in ("crashed", "disk_full"))
        self.resume_button.setText(f"Resume from {checkpoint}" if checkpoint else "Resume")
        self.setVisible(True)

    def show_crash(self, report: str, checkpoint: str = "") -> None:
        """A worker that died without a last word: its first line, the report as tooltip."""
        self.show_failure(_Crash(report.splitlines()[0] if report else "the worker crashed"), checkpoint)
        self.message.setToolTip(report)

    def _on_fix_button_clicked(self) -> None:
        self.fix_requested.emit(dict(self._fix))
        self.fix_button.setEnabled(False)
        self.fix_button.setText("Fix applied: " + ", ".join(f"{k} = {v}" for k, v in self._fix.items()))
        self.restart_button.setVisible(True)


class _Crash:
    kind = "crashed"
    hint = ""

    def __init__(self, message: str) -> None:
        self.message = message
