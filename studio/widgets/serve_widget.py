"""ServeWidget: the Serve panel, a run's export behind an OpenAI-compatible server on 127.0.0.1.

Start runs `finetune-studio serve` (backend/cli/serve_run.py) in a QProcess, so the window and the
terminal serve the same way and the studio never imports torch or transformers. The panel makes the
token and hands it over in the environment, shows it once with the URL and the model name, and shows
the exact command the CLI runs. Stop sends SIGTERM, which the CLI turns into the same clean stop as
Ctrl-C (every server process ended, the port freed); a CLI that does not end in time is killed (the
server then ends with it: PR_SET_PDEATHSIG and the client watch).
"""

from __future__ import annotations

import secrets
import sys

from PySide6.QtCore import QProcess, QProcessEnvironment, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from backend.api.launch import module_command, worker_env
from backend.core.registries.serving_options import DEVICES, ENGINES, SERVED_FORMATS, TOKEN_ENV
from studio.services.line_buffer import LineBuffer
from studio.widgets.log_view_widget import LogViewWidget

STOP_GRACE_MS = 20_000
"""How long Stop waits for the CLI's clean stop before killing it."""
LOG_LINES = 200


class ServeWidget(QWidget):
    """Format, engine, device and port; Start/Stop; URL, token and the command while it serves."""

    serving_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._target = ""
        self._process: QProcess | None = None
        self._buffer = LineBuffer()
        self._token = ""
        self._ready = False
        self.format_combo = QComboBox()
        self.format_combo.addItem("the run's first export", None)
        for name in SERVED_FORMATS:
            self.format_combo.addItem(name, name)
        self.format_combo.setToolTip("which export to serve; gptq-int4, awq-int4 and w8a8 are compressed-tensors "
                                     "exports: vLLM runs their integers on a GPU, transformers unpacks them to "
                                     "16-bit (CPU or GPU); a GGUF goes to llama.cpp")
        self.engine_combo = QComboBox()
        for name in ENGINES:
            self.engine_combo.addItem(name, name)
        self.engine_combo.setToolTip("auto: llama.cpp for a GGUF export, vLLM when installed on a GPU, else "
                                     "transformers serve with continuous batching")
        self.device_combo = QComboBox()
        for name in DEVICES:
            self.device_combo.addItem(name, name)
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(8000)
        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self.start)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        buttons = QHBoxLayout()
        buttons.addWidget(self.start_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        self.status_label = QLabel("")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.url_edit = QLineEdit()
        self.token_edit = QLineEdit()
        self.command_edit = QLineEdit()
        for edit in (self.url_edit, self.token_edit, self.command_edit):
            edit.setReadOnly(True)
        self.token_edit.setToolTip("clients send it as the API key (Authorization: Bearer …); shown for this "
                                   "server only, a new one is made at every start")
        self.log = LogViewWidget(LOG_LINES)  # follows new lines unless the person scrolled up
        options = QGridLayout()  # two options a row: the panel sits under Evaluate and must stay short
        for index, (label, field) in enumerate((("Format", self.format_combo), ("Engine", self.engine_combo),
                                                ("Device", self.device_combo), ("Port", self.port_spin))):
            options.addWidget(QLabel(label), index // 2, (index % 2) * 2)
            options.addWidget(field, index // 2, (index % 2) * 2 + 1)
        options.setColumnStretch(1, 1)
        options.setColumnStretch(3, 1)
        form = QFormLayout()
        form.addRow("URL", self.url_edit)
        form.addRow("API key", self.token_edit)
        form.addRow("Command", self.command_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(options)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        layout.addWidget(self.log, 1)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.setInterval(STOP_GRACE_MS)
        self._kill_timer.timeout.connect(self._on_kill_timer_timeout)
        app = QApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        self._update_buttons()

    # --- state ----------------------------------------------------------------------------------
    def set_target(self, path: str) -> None:
        """The run (or export, or model folder) Start serves. Another one clears what the last server said,
        unless that server still runs (its log and URL are still true)."""
        if path != self._target and not self.running():
            self.log.clear()
            self._say("")
        self._target = path
        self._update_buttons()

    def running(self) -> bool:
        return self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning

    def ready(self) -> bool:
        return self._ready

    def argv(self) -> list[str]:
        """The CLI line Start runs (the token travels in the environment)."""
        cli = [sys.executable] if getattr(sys, "frozen", False) else module_command("backend.cli")  # a bundle is the CLI
        args = [*cli, "serve", self._target, "--port", str(self.port_spin.value()),
                "--engine", self.engine_combo.currentData(), "--device", self.device_combo.currentData()]
        if self.format_combo.currentData():
            args += ["--format", self.format_combo.currentData()]
        return args

    def _update_buttons(self) -> None:
        running = self.running()
        self.start_button.setEnabled(bool(self._target) and not running)
        self.stop_button.setEnabled(running)
        for field in (self.format_combo, self.engine_combo, self.device_combo, self.port_spin):
            field.setEnabled(not running)

    def _say(self, text: str, error: bool = False) -> None:
        self.status_label.setText(text)
        self.status_label.setStyleSheet("color: #c0392b;" if error else "")

    # --- start / stop ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.running() or not self._target:
            return
        self._token = f"fs-{secrets.token_urlsafe(24)}"
        self._ready = False
        self._buffer = LineBuffer()
        for edit in (self.url_edit, self.token_edit, self.command_edit):
            edit.clear()
        self.log.clear()
        environment = QProcessEnvironment()
        for key, value in {**worker_env(), TOKEN_ENV: self._token}.items():
            environment.insert(key, value)
        argv = self.argv()
        process = QProcess(self)
        process.setProcessEnvironment(environment)
        process.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        process.setProgram(argv[0])
        process.setArguments(argv[1:])
        process.readyReadStandardOutput.connect(self._on_process_ready_read)
        process.finished.connect(self._on_process_finished)
        self._process = process
        self._say("starting the server (loading the model)…")
        process.start()
        self._update_buttons()
        self.serving_changed.emit(True)

    def stop(self) -> None:
        """SIGTERM: the CLI stops the server and every process it started, then exits."""
        if self.running():
            assert self._process is not None
            self._say("stopping the server…")
            self._process.terminate()
            self._kill_timer.start()

    def _on_kill_timer_timeout(self) -> None:
        if self.running():
            assert self._process is not None
            self._process.kill()

    def shutdown(self, timeout_ms: int = STOP_GRACE_MS) -> None:
        """Stop and reap synchronously (the window closing): never leave a server behind."""
        process = self._process
        if process is not None and process.state() != QProcess.ProcessState.NotRunning:
            process.terminate()
            if not process.waitForFinished(timeout_ms):
                process.kill()
                process.waitForFinished(5000)

    # --- the CLI's lines ------------------------------------------------------------------------
    def _on_process_ready_read(self) -> None:
        if self._process is None:
            return
        for line in self._buffer.feed(bytes(self._process.readAllStandardOutput().data())):
            self._on_line(line)

    def _on_line(self, line: str) -> None:
        if line.startswith("token:"):
            self.token_edit.setText(self._token)
            return  # the token is in its field; the log keeps no copy
        self.log.append_line(line)
        head, _, rest = line.partition(":")
        rest = rest.strip()
        if head == "command":
            self.command_edit.setText(rest)
        elif head == "ready":
            url, _, model = rest.partition("  model ")
            self.url_edit.setText(url)
            self._ready = True
            self._say(f"serving {model} at {url} (OpenAI API; the API key below is required)")
        elif head == "error":
            self._say(rest, error=True)

    def _on_process_finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        self._on_process_ready_read()
        tail = self._buffer.flush()
        if tail:
            self._on_line(tail)
        self._kill_timer.stop()
        was_error = self.status_label.styleSheet() != ""
        self._ready = False
        self.url_edit.clear()
        self.token_edit.clear()
        if not was_error:
            self._say("stopped; the port is free" if code == 0 else f"the server ended (exit code {code}); "
                      "its last lines are below", error=code != 0)
        self._process = None
        self._update_buttons()
        self.serving_changed.emit(False)
