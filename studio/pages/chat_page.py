"""ChatPage: step 7, talk to a finished run's model: the base, the tuned one, or both side by side.

Each message starts a fresh chat worker with the whole conversation (the worker keeps no state);
the answer streams into its pane token by token, and Stop cuts it short. Loading a model while a
fine-tune runs competes for the same memory, so Send first says how much the running config is
predicted to take against the device's memory and asks to continue.
"""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtGui import QShowEvent, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from backend.protocol import PhaseChanged, TokensGenerated
from studio.job_controller import JobController, JobOutcome, failure_text
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.run_picker_widget import RunPickerWidget
from studio.widgets.units import human_bytes

MODELS = (("tuned", "Tuned model"), ("base", "Base model"), ("both", "Both, side by side"))


def memory_warning(config: Any, device: str, limit_bytes: int | None, label: str,
                   predicted: int | None = None) -> str:
    """A sentence on the memory a running fine-tune of `config` takes, against the device's limit:
    `predicted`, the Train page's figure for the run, else the shared estimate of its config."""
    peak = predicted
    if not peak:
        from backend.run_estimate import estimate_run

        try:
            peak = estimate_run(config, device).total_bytes
        except (AttributeError, ValueError, OSError, KeyError, TypeError, ZeroDivisionError):
            peak = None
    limit = f" of {human_bytes(limit_bytes)} ({label})" if limit_bytes else ""
    taken = f"is predicted to take {human_bytes(peak)}{limit}" if peak else "takes an unknown share of memory"
    return (f"A fine-tune is running and {taken}. Loading a model for chat needs its own memory on top; "
            "if it does not fit, the chat or the run may fail with out of memory.")


class ChatPage(QWidget):
    """Run picker, model and sampling options, one or two answer panes, the message box."""

    def __init__(self, jobs: JobController, training_warning: Callable[[], str] | None = None,
                 preferred_run: Callable[[], str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.training_warning: Callable[[], str] = training_warning or (lambda: "")
        """A memory sentence when a fine-tune is running ("" when none)."""
        self.confirm_memory: Callable[[str], bool] = self._ask_memory
        """Asked with that sentence before loading a model during a run; tests replace it."""
        self.history: list[dict[str, str]] = []
        """The conversation sent with each message (the tuned answers when both models answer)."""
        self._target = "tuned"
        self._answers: dict[str, str] = {}
        header = PageHeaderWidget("Chat", "Try the tuned model, or compare it with the base model on the same "
                                          "conversation. Each message loads the model afresh.")
        self.picker = RunPickerWidget(preferred_run)
        self.model_combo = QComboBox()
        for key, title in MODELS:
            self.model_combo.addItem(title, key)
        self.model_combo.currentIndexChanged.connect(self._on_model_combo_current_index_changed)
        self.temperature = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=2.0, singleStep=0.1, value=0.7)
        self.temperature.setToolTip("0 always picks the likeliest token; higher is more varied")
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.05, maximum=1.0, singleStep=0.05, value=0.9)
        self.top_p.setToolTip("Sample only from the likeliest tokens covering this probability")
        self.max_tokens = QSpinBox(minimum=1, maximum=4096, value=256)
        self.max_tokens.setToolTip("Longest answer, in tokens")
        options = QHBoxLayout()
        for text, widget in (("Model", self.model_combo), ("Temperature", self.temperature), ("Top-p", self.top_p),
                             ("Max tokens", self.max_tokens)):
            options.addWidget(QLabel(text))
            options.addWidget(widget)
        options.addStretch(1)

        self.panes: dict[str, QPlainTextEdit] = {}
        self.boxes: dict[str, QGroupBox] = {}
        panes = QHBoxLayout()
        for key, title in (("base", "Base model"), ("tuned", "Tuned model")):
            pane = QPlainTextEdit()
            pane.setReadOnly(True)
            pane.setPlaceholderText(f"The {title.lower()}'s answers appear here.")
            box = QGroupBox(title)
            QVBoxLayout(box).addWidget(pane)
            self.panes[key], self.boxes[key] = pane, box
            panes.addWidget(box)

        self.message_edit = QLineEdit()
        self.message_edit.setPlaceholderText("Type a message and press Enter")
        self.message_edit.returnPressed.connect(self.send)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.jobs.cancel)
        self.clear_button = QPushButton("New conversation")
        self.clear_button.clicked.connect(self.clear_conversation)
        send_row = QHBoxLayout()
        send_row.addWidget(self.message_edit, 1)
        for button in (self.send_button, self.stop_button, self.clear_button):
            send_row.addWidget(button)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)

        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addWidget(self.picker)
        layout.addLayout(options)
        layout.addLayout(panes, 1)
        layout.addLayout(send_row)
        layout.addWidget(self.status_label)
        self.picker.run_changed.connect(lambda _path: self.clear_conversation())
        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        jobs.running_changed.connect(lambda _running: self._update_buttons())
        self._on_model_combo_current_index_changed(0)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        if not self.jobs.is_running():
            self.picker.refresh()

    def model(self) -> str:
        return str(self.model_combo.currentData())

    def set_model(self, key: str) -> None:
        self.model_combo.setCurrentIndex(self.model_combo.findData(key))

    def clear_conversation(self) -> None:
        if self.jobs.is_running():
            return
        self.history = []
        for pane in self.panes.values():
            pane.clear()
        self._say("")
        self._update_buttons()

    def send(self) -> None:
        """Start a chat worker with the conversation plus the typed message."""
        text = self.message_edit.text().strip()
        folder = self.picker.folder()
        if not text or folder is None or self.jobs.is_running():
            return
        warning = self.training_warning()
        if warning and not self.confirm_memory(warning):
            return
        try:
            config = folder.load_config()
        except ValueError as exc:
            self._say(f"cannot read {folder.config_path}: {exc}", True)
            return
        self.history.append({"role": "user", "content": text})
        self.message_edit.clear()
        which = ["base", "tuned"] if self.model() == "both" else [self.model()]
        self._answers = {key: "" for key in which}
        self._target = which[0]
        for key in which:
            self._append(key, ("\n\n" if self.panes[key].toPlainText() else "") + f"You: {text}\n\n{key.capitalize()}: ")
        params = {"model": self.model(), "temperature": self.temperature.value(), "top_p": self.top_p.value(),
                  "max_new_tokens": self.max_tokens.value(), "messages": list(self.history)}
        self._say("Loading the model…")
        self.jobs.start(folder, config, job="chat", params=params)

    def _on_model_combo_current_index_changed(self, _index: int) -> None:
        model = self.model()
        self.boxes["base"].setVisible(model in ("base", "both"))
        self.boxes["tuned"].setVisible(model in ("tuned", "both"))

    def _on_jobs_event_received(self, event: Any) -> None:
        if isinstance(event, PhaseChanged) and event.phase == "generate" and event.detail in self.panes:
            self._target = event.detail
            self._say(f"The {event.detail} model is answering…")
        elif isinstance(event, TokensGenerated) and event.text and self._target in self._answers:
            self._answers[self._target] += event.text
            self._append(self._target, event.text)

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        if outcome.ok:
            answer = self._answers.get("tuned", next(iter(self._answers.values()), ""))
            self.history.append({"role": "assistant", "content": answer})
            self._say("Stopped: the answer so far is kept." if outcome.status == "stopped" else "")
            return
        if self.history and self.history[-1]["role"] == "user":
            self.history.pop()  # the message was not answered: it is not part of the conversation
        self._say(failure_text("Chat", outcome), True)

    def _append(self, key: str, text: str) -> None:
        pane = self.panes[key]
        cursor = pane.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        pane.setTextCursor(cursor)
        pane.ensureCursorVisible()

    def _ask_memory(self, warning: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, "A fine-tune is running", warning, parent=self)
        box.setStandardButtons(QMessageBox.StandardButton.Ok | QMessageBox.StandardButton.Cancel)
        box.button(QMessageBox.StandardButton.Ok).setText("Continue")
        return box.exec() == QMessageBox.StandardButton.Ok

    def _update_buttons(self) -> None:
        running = self.jobs.is_running()
        self.send_button.setEnabled(not running and bool(self.picker.path()))
        self.stop_button.setEnabled(running)
        self.clear_button.setEnabled(not running)
        self.picker.setEnabled(not running)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #dc2626;" if error else "")
