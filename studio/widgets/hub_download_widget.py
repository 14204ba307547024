"""HubDownloadWidget: the Model page's "Hub id" row: type an id, Download, watch the bytes, Cancel.

Offline (HF_HUB_OFFLINE set, or no huggingface_hub) the row stays visible but disabled, with the
reason beside it, so a person knows downloads exist and why they are off.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout, QWidget

from studio.services.hub_download import HubDownload, Progress, check_hub_id, hub_available, target_folder
from studio.widgets.units import human_bytes


class HubDownloadWidget(QWidget):
    """Hub id field, Download/Cancel button, a byte progress bar and a one-line status."""

    downloaded = Signal(str)
    """The local folder of a complete download, ready to be chosen as the model."""
    config_fetched = Signal(str)
    """The model's download folder, holding its config.json alone: enough to estimate, not to train."""

    def __init__(self, endpoint: str | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.download = HubDownload(endpoint, self)
        self.download.progress.connect(self._on_progress)
        self.download.finished.connect(self._on_finished)
        self.download.failed.connect(self._on_failed)
        self.download.config_fetched.connect(self._on_config_fetched)
        app = QCoreApplication.instance()
        if app is not None:  # the thread must not outlive the window
            app.aboutToQuit.connect(self.shutdown)
        self.edit = QLineEdit()
        self.edit.setPlaceholderText("organisation/model-name, e.g. Qwen/Qwen2.5-0.5B")
        self.edit.returnPressed.connect(self._on_button_clicked)
        self.button = QPushButton("Download")
        self.button.clicked.connect(self._on_button_clicked)
        self.config_button = QPushButton("Config only")
        self.config_button.clicked.connect(self._on_config_button_clicked)
        self.bar = QProgressBar()
        self.bar.setVisible(False)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: palette(placeholder-text);")
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.edit, 1)
        row.addWidget(self.button)
        row.addWidget(self.config_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.bar)
        layout.addWidget(self.note)
        self.refresh_availability()

    def refresh_availability(self) -> None:
        ok, reason = hub_available()
        for widget in (self.edit, self.button, self.config_button):
            widget.setEnabled(ok)
            widget.setToolTip(reason or "Download into the studio's models folder; the worker itself never "
                                        "goes online.")
        if ok:
            self.config_button.setToolTip("Fetch only config.json (a few KB) to see the memory estimate before "
                                          "downloading the weights; Download reuses it")
        self.note.setText(reason or "Downloads into the studio's models folder, then uses it like a local folder.")

    # --- actions ------------------------------------------------------------------------------
    def _on_button_clicked(self) -> None:
        if self.download.is_running():
            self.download.cancel()
            self.button.setEnabled(False)
            self.note.setText("Cancelling…")
            return
        repo_id = self.edit.text().strip()
        problem = check_hub_id(repo_id)
        if problem:
            self.note.setText(problem)
            return
        self.bar.setRange(0, 0)  # busy until the file list (and so the total) is known
        self.bar.setVisible(True)
        self.button.setText("Cancel")
        self.edit.setEnabled(False)
        self.note.setText(f"Asking the Hub for {repo_id}'s files…")
        self.download.start(repo_id)

    def _on_config_button_clicked(self) -> None:
        repo_id = self.edit.text().strip()
        problem = check_hub_id(repo_id)
        if problem:
            self.note.setText(problem)
            return
        for widget in (self.button, self.config_button, self.edit):
            widget.setEnabled(False)
        self.note.setText(f"Fetching {repo_id}'s config.json…")
        self.download.fetch_config(repo_id)

    def shutdown(self) -> None:
        """Cancel and wait: closing the window mid-download must not leave a thread running."""
        if self.download.is_running():
            self.download.cancel()
            self.download.wait()

    # --- reports ------------------------------------------------------------------------------
    def _on_progress(self, progress: Progress) -> None:
        scale = max(1, progress.total // 1_000_000)  # QProgressBar is 32-bit: count in MB for big models
        self.bar.setRange(0, max(1, progress.total // scale))
        self.bar.setValue(progress.done // scale)
        where = f" · {progress.file}" if progress.file else ""
        self.note.setText(f"{human_bytes(progress.done)} of {human_bytes(progress.total)}{where}")

    def _on_finished(self, folder: str) -> None:
        self._idle()
        self.note.setText(f"Downloaded to {folder}")
        self.downloaded.emit(folder)

    def _on_failed(self, reason: str) -> None:
        self._idle()
        if reason == "cancelled":
            reason = (f"Cancelled; the files completed so far stay in {target_folder(self.edit.text().strip())}, "
                      f"and downloading again fetches only the rest.")
        self.note.setText(reason)

    def _on_config_fetched(self, folder: str) -> None:
        self._idle()
        self.note.setText(f"config.json is in {folder}: the Techniques page estimates the run; Download fetches "
                          "the weights (Start waits for them)")
        self.config_fetched.emit(folder)

    def _idle(self) -> None:
        self.bar.setVisible(False)
        self.button.setText("Download")
        for widget in (self.button, self.config_button, self.edit):
            widget.setEnabled(True)
