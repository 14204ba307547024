"""ChatPage: step 7, talk to a finished run's model: the base, the tuned one, or both side by side.

Loading the model is what makes a message slow on a CPU, so the page keeps one chat session: the
first Send starts a worker with the first message and the worker keeps the model loaded; every later
Send is a ChatMessage to the same worker (the whole conversation each time). Each answer streams into
its pane token by token; Stop cuts the answer and keeps the session; New conversation clears the
history and keeps the model; Unload, or picking another run, ends the session and frees its memory.
Loading a model while a fine-tune runs competes for the same memory, so starting a session first says
how much the running config is predicted to take against the device's memory and asks to continue.
A vision-language run's models read images: the Image… button or a drop on the message box attaches them to
the next message (an `<image>` marker per image leads its text, the paths travel in ChatMessage.images), and
the conversation shows their thumbnails; for a text model's run attaching is off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QUrl
from PySide6.QtGui import QShowEvent, QTextCursor, QTextDocument, QTextImageFormat
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from backend.api.vision import read_vision
from backend.core.data.conversation import IMAGE_MARKER
from backend.core.data.images import ImageRef
from backend.core.protocol import AnswerFinished, ChatMessage, MessageRefused, PhaseChanged, StopAnswer, TokensGenerated
from backend.core.runs.run_folder import RunFolder
from studio.job_controller import JobController, JobOutcome, failure_text
from studio.widgets.image_attach_widget import ImageAttachWidget
from studio.widgets.message_edit import MessageEdit
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.thumbnail import thumbnail
from studio.widgets.run_picker_widget import RunPickerWidget
from studio.widgets.units import human_bytes

SHOWN = 96
"""An attached image's side in the conversation, in pixels."""
MODELS = (("tuned", "Tuned model"), ("base", "Base model"), ("both", "Both, side by side"))
LOADED = "Model loaded; answers come without reloading."


def reads_images(folder: RunFolder | None) -> bool:
    """Whether the run's model is a proven vision-language model (read from files: no torch)."""
    if folder is None:
        return False
    try:
        model = folder.load_config().resolved_model_path()
    except (ValueError, OSError):
        return False
    return (model / "config.json").is_file() and read_vision(model).family is not None


def memory_warning(config: Any, device: str, limit_bytes: int | None, label: str,
                   predicted: int | None = None) -> str:
    """A sentence on the memory a running fine-tune of `config` takes, against the device's limit:
    `predicted`, the Train page's figure for the run, else the shared estimate of its config."""
    peak = predicted
    if not peak:
        from backend.api.estimates import estimate_run

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
        self.images: list[str] = []
        """The conversation's image files, in the order of its `<image>` markers."""
        self._new_images = 0
        self._shown = 0
        """Thumbnails put in the panes so far (each gets its own resource name)."""
        self._target = "tuned"
        self._answers: dict[str, str] = {}
        self.answering = False
        """True from Send until the answer is complete (or refused, or the session ended)."""
        self._session: RunFolder | None = None
        """The run whose model the live session holds (None when no session runs)."""
        self._session_full = False
        """The session's run is a full fine-tune: base and tuned are two models, loaded in turn."""
        self._ending = ""
        """What to say when the session we asked to end has ended ("" when it ended on its own)."""
        header = PageHeaderWidget("Chat", "Try the tuned model, or compare it with the base model on the same "
                                          "conversation. The model loads with the first message and stays "
                                          "loaded until you unload it.")
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

        self.panes: dict[str, QTextEdit] = {}
        self.boxes: dict[str, QGroupBox] = {}
        panes = QHBoxLayout()
        for key, title in (("base", "Base model"), ("tuned", "Tuned model")):
            pane = QTextEdit()
            pane.setReadOnly(True)
            pane.setAcceptRichText(False)
            pane.setPlaceholderText(f"The {title.lower()}'s answers appear here.")
            box = QGroupBox(title)
            QVBoxLayout(box).addWidget(pane)
            self.panes[key], self.boxes[key] = pane, box
            panes.addWidget(box)

        self.message_edit = MessageEdit()
        self.message_edit.setPlaceholderText("Type a message and press Enter")
        self.message_edit.returnPressed.connect(self.send)
        self.attach = ImageAttachWidget()
        self.message_edit.images_dropped.connect(self.attach.attach)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Cut the answer here; the model stays loaded")
        self.stop_button.clicked.connect(self.stop_answer)
        self.clear_button = QPushButton("New conversation")
        self.clear_button.setToolTip("Forget the conversation; the model stays loaded")
        self.clear_button.clicked.connect(self.clear_conversation)
        self.unload_button = QPushButton("Unload")
        self.unload_button.setToolTip("End the chat session and free the model's memory (before a fine-tune, say)")
        self.unload_button.clicked.connect(self.unload)
        send_row = QHBoxLayout()
        send_row.addWidget(self.attach)
        send_row.addWidget(self.message_edit, 1)
        for button in (self.send_button, self.stop_button, self.clear_button, self.unload_button):
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
        self.picker.run_changed.connect(self._on_picker_run_changed)
        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        jobs.running_changed.connect(lambda _running: self._update_buttons())
        self._on_model_combo_current_index_changed(0)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        self.refresh_runs()

    def refresh_runs(self) -> None:
        """Re-read the finished runs (the picker may follow a new one), unless an answer is on its way."""
        if not self.answering:
            self.picker.refresh()
            self._update_image_side()

    def model(self) -> str:
        return str(self.model_combo.currentData())

    def set_model(self, key: str) -> None:
        self.model_combo.setCurrentIndex(self.model_combo.findData(key))

    def session_live(self) -> bool:
        """A session worker holds the picked run's model and takes messages (not ending, not ended)."""
        return (self._session is not None and self.jobs.is_running() and not self._ending
                and self.jobs.status in ("starting", "running"))

    def clear_conversation(self) -> None:
        """Forget the conversation; a live session keeps its model for the next one."""
        if self.answering:
            return
        self.history, self.images = [], []
        for pane in self.panes.values():
            pane.clear()
        self._say(LOADED if self.session_live() else "")
        self._update_buttons()

    def send(self) -> None:
        """Send the conversation plus the typed message: to the live session, or to a new one."""
        text = self.message_edit.text().strip()
        folder = self.picker.folder()
        if not text or folder is None or self.answering:
            return
        self.picker.choose(str(folder.path))  # a conversation picks its run: a new run must not end it
        new = self.attach.take()
        images = self.images + new
        messages = self.history + [{"role": "user", "content": IMAGE_MARKER * len(new) + text}]
        if self.session_live() and self._session is not None and self._session.path == folder.path:
            if not self.jobs.send(ChatMessage(messages=messages, images=images, **self._sampling())):
                self.attach.attach(new)
                self._say("The chat session is not taking messages; try again in a moment.", True)
                return
        else:
            if self.jobs.is_running():
                self.attach.attach(new)
                return  # the previous session is still closing
            warning = self.training_warning()
            if warning and not self.confirm_memory(warning):
                self.attach.attach(new)
                return
            try:
                config = folder.load_config()
            except ValueError as exc:
                self.attach.attach(new)
                self._say(f"cannot read {folder.config_path}: {exc}", True)
                return
            self._session, self._session_full, self._ending = folder, config.technique.method == "full", ""
            self._say("Loading the model…")
            shown = {"images": images} if images else {}
            self.jobs.start(folder, config, job="chat", params={"session": True, "messages": messages,
                                                                 **shown, **self._sampling()})
        self.history, self.images, self._new_images = messages, images, len(new)
        self.message_edit.clear()
        which = ["base", "tuned"] if self.model() == "both" else [self.model()]
        self._answers = {key: "" for key in which}
        self._target = which[0]
        for key in which:
            self._append(key, ("\n\n" if self.panes[key].toPlainText() else "") + ("You:\n" if new else "You: "))
            self._append_images(key, new)
            self._append(key, f"{text}\n\n{key.capitalize()}: ")
        self.answering = True
        self._update_buttons()

    def stop_answer(self) -> None:
        """Cut the answer at the next token; the session stays (before the worker is ready: end it)."""
        if not self.answering:
            return
        if not self.jobs.send(StopAnswer()):
            self._end_session("Stopped before the model loaded; the next message loads it.")
            return
        self._say("Stopping the answer…")

    def unload(self) -> None:
        """End the session: the worker exits and the model's memory is free again."""
        self._end_session("Model unloaded: the next message loads it again.")

    def _end_session(self, note: str) -> None:
        if self._session is None or not self.jobs.is_running() or self._ending:
            return
        self._ending = note
        self._say("Unloading the model…")
        self.jobs.stop()
        self._update_buttons()

    def _sampling(self) -> dict[str, Any]:
        return {"model": self.model(), "temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "max_new_tokens": self.max_tokens.value()}

    def _update_image_side(self) -> None:
        """Attaching is on for a run whose model reads images (a proven vision-language family)."""
        allowed = reads_images(self.picker.folder())
        self.attach.set_allowed(allowed)
        self.message_edit.accepts_images = allowed

    def _on_picker_run_changed(self, _path: str) -> None:
        self._update_image_side()
        self.clear_conversation()
        self._end_session("The chat session ended with the change of run; the next message loads its model.")

    def _on_model_combo_current_index_changed(self, _index: int) -> None:
        model = self.model()
        self.boxes["base"].setVisible(model in ("base", "both"))
        self.boxes["tuned"].setVisible(model in ("tuned", "both"))
        if self.session_live() and not self.answering:
            self._say("A full fine-tune keeps one model in memory: the next answer loads the base or tuned weights "
                      "it needs, in the same session." if self._session_full else
                      "The base model is the tuned one with its adapter switched off: the loaded model answers "
                      "for both, without reloading.")

    def _on_jobs_event_received(self, event: Any) -> None:
        if isinstance(event, PhaseChanged) and event.phase == "load_model":
            self._say(f"Loading the {event.detail} model…")
        elif isinstance(event, PhaseChanged) and event.phase == "generate" and event.detail in self.panes:
            self._target = event.detail
            self._say(f"The {event.detail} model is answering…")
        elif isinstance(event, TokensGenerated) and event.text and self._target in self._answers:
            self._answers[self._target] += event.text
            self._append(self._target, event.text)
        elif isinstance(event, AnswerFinished) and self.answering:
            self._on_answer_finished(event)
        elif isinstance(event, MessageRefused) and self.answering:
            self._unanswered()
            for key in self._answers:
                self._append(key, "(refused)")
            hint = f" Hint: {event.hint}" if event.hint else ""
            self._say(f"Message refused: {event.message}.{hint} The model stays loaded.", True)
            self._update_buttons()

    def _on_answer_finished(self, event: AnswerFinished) -> None:
        if event.stopped and not event.tokens:
            self._unanswered()
            stopped = "Stopped before the answer began. "
        else:
            answer = self._answers.get("tuned", next(iter(self._answers.values()), ""))
            self.history.append({"role": "assistant", "content": answer})
            self.answering = False
            stopped = "Stopped: the answer so far is kept. " if event.stopped else ""
        took = f" (answered in {event.seconds:.1f} s)" if event.seconds and not event.stopped else ""
        self._say(stopped + LOADED + took)
        self._update_buttons()

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        note, self._session, self._ending = self._ending, None, ""
        self._unanswered()
        if note and (outcome.ok or outcome.status == "cancelled"):
            self._say(note)
        elif outcome.ok:
            self._say("The chat session ended; the next message loads the model again.")
        else:
            self._say(failure_text("Chat", outcome), True)
        self._update_buttons()

    def _unanswered(self) -> None:
        """The message in flight got no answer: it is not part of the conversation."""
        if self.answering and self.history and self.history[-1]["role"] == "user":
            self.history.pop()
            if self._new_images:
                self.images = self.images[:-self._new_images]
        self._new_images = 0
        self.answering = False

    def _append(self, key: str, text: str) -> None:
        pane = self.panes[key]
        cursor = pane.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        pane.setTextCursor(cursor)
        pane.ensureCursorVisible()

    def _append_images(self, key: str, paths: list[str]) -> None:
        """Thumbnails of the images a message carries, in the pane's text where the message shows them."""
        cursor = self.panes[key].textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        document = self.panes[key].document()
        for path in paths:
            self._shown += 1
            name = f"chat-image-{self._shown}"
            document.addResource(QTextDocument.ResourceType.ImageResource.value, QUrl(name),
                                 thumbnail(ImageRef(path, path=Path(path)), SHOWN))
            image = QTextImageFormat()
            image.setName(name)
            cursor.insertImage(image)
            cursor.insertText(" ")
        if paths:
            cursor.insertText("\n")

    def _ask_memory(self, warning: str) -> bool:
        box = QMessageBox(QMessageBox.Icon.Warning, "A fine-tune is running", warning, parent=self)
        box.setStandardButtons(QMessageBox.StandardButton.Ok | QMessageBox.StandardButton.Cancel)
        box.button(QMessageBox.StandardButton.Ok).setText("Continue")
        return box.exec() == QMessageBox.StandardButton.Ok

    def _update_buttons(self) -> None:
        closing = self.jobs.is_running() and not self.session_live()  # a session ending, or the first starting
        self.send_button.setEnabled(not self.answering and not closing and bool(self.picker.path()))
        self.stop_button.setEnabled(self.answering)
        self.clear_button.setEnabled(not self.answering)
        self.unload_button.setEnabled(self.session_live())
        self.picker.setEnabled(not self.answering)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #dc2626;" if error else "")
