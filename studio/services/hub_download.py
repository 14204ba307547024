"""HubDownload: fetch a model from the Hugging Face Hub into the studio's models folder, off the GUI thread.

Only the studio downloads, and only when the person asks: the worker always runs with
HF_HUB_OFFLINE=1. The file list and sizes come first (one `model_info` call), so progress is in bytes
of the whole model from the start; files are then fetched one at a time with `hf_hub_download`
into a plain folder (`local_dir`), which the rest of the studio treats like any local model folder.
Cancelling stops at the next received chunk. Completed files stay (with huggingface_hub's metadata
beside them), so a second download of the same id fetches only the rest; the file cut short is
discarded by huggingface_hub itself (since 1.x it no longer resumes a partial file across calls).
"""

from __future__ import annotations

import re
from fnmatch import fnmatch
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal

from backend.api.hub_config import fetch_model_config, hub_offline_reason
from backend.core.paths import HUB_PREFIX, hub_folder, models_dir

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""organisation/name, as the Hub spells repository ids."""
SKIP = (".gitattributes", "README.md", "*.md", "*.png", "*.jpg", "*.gif", "original/*", "*.pth", "*.pt",
        "*.msgpack", "*.h5", "*.ot", "onnx/*", "*.onnx", "openvino/*", "coreml/*")
"""Files a fine-tune never reads; `*.pt(h)` and `original/` are duplicate weights in other formats."""


class Cancelled(Exception):
    """Raised inside the download when the person pressed Cancel."""


def hub_available() -> tuple[bool, str]:
    """Whether downloads may be offered, and if not the one-line reason (backend.api.hub_config's)."""
    reason = hub_offline_reason()
    return not reason, reason


def target_folder(repo_id: str) -> Path:
    """Where a hub id lands (backend.core.paths.hub_folder, so that `hub:` model paths find it)."""
    return hub_folder(repo_id)


def check_hub_id(text: str) -> str:
    """The error for a malformed id, or "" when it looks like organisation/name."""
    if not text:
        return "type a hub id such as Qwen/Qwen2.5-0.5B"
    if not HUB_ID.match(text):
        return f"'{text}' is not a hub id: expected organisation/model-name, such as Qwen/Qwen2.5-0.5B"
    return ""


@dataclass
class Progress:
    done: int
    total: int
    file: str


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch(name, pattern) for pattern in patterns)


def explain(exc: BaseException, repo_id: str, endpoint: str) -> str:
    """One line that names the cause and the fix, for the errors people actually meet."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError):
        return (f"{repo_id} is gated: accept its licence on its Hub page, then log in on this computer "
                f"(`hf auth login`) and download again")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"no model '{repo_id}' on {endpoint} (or it is private: log in with `hf auth login`); "
                f"check the spelling")
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo_id} has no such revision on {endpoint}"
    if isinstance(exc, HfHubHTTPError):
        return f"{endpoint} answered with an error for {repo_id}: {str(exc).splitlines()[0]}"
    if isinstance(exc, OSError) and exc.errno == 28:
        return f"the disk is full: free space under {models_dir()} and download again"
    name = type(exc).__name__
    if "Connect" in name or "Timeout" in name or isinstance(exc, (ConnectionError, TimeoutError)):
        return f"could not reach {endpoint}: check the connection, or pick a local folder instead"
    return f"download of {repo_id} failed: {name}: {str(exc).splitlines()[0] if str(exc) else ''}"


class _Job(QThread):
    progress = Signal(object)
    """Progress(done bytes, total bytes, current file)."""

    def __init__(self, repo_id: str, endpoint: str | None, folder: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo_id, self.endpoint, self.folder = repo_id, endpoint, folder
        self.cancel_event = threading.Event()
        self.result_path = ""
        self.error = ""

    def run(self) -> None:
        try:
            self.result_path = self._download()
        except Cancelled:
            self.error = "cancelled"
        except Exception as exc:  # reported as one line in the page, never a traceback
            from huggingface_hub import constants

            self.error = explain(exc, self.repo_id, self.endpoint or constants.ENDPOINT)

    def _download(self) -> str:
        from huggingface_hub import HfApi, constants, hf_hub_download
        from tqdm.std import tqdm  # imported here: the Model page must paint without it

        # huggingface_hub reads the body in 10 MiB chunks and reports (and so can be cancelled) only
        # between them: on a slow line that is many seconds of a frozen bar. 1 MiB keeps both prompt;
        # only this process downloads, so the module-wide setting touches nothing else.
        constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, 1 << 20)

        info = HfApi(endpoint=self.endpoint).model_info(self.repo_id, files_metadata=True)
        files = [(s.rfilename, s.size or 0) for s in info.siblings or [] if not _matches(s.rfilename, SKIP)]
        if not any(name == "config.json" for name, _ in files):
            raise ValueError(f"{self.repo_id} has no config.json: it is not a transformers model")
        total = sum(size for _, size in files)
        done = 0
        job = self

        class Bar(tqdm):
            """hf_hub_download's per-file byte bar, turned into progress signals and a cancel point."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["disable"] = True
                super().__init__(*args, **kwargs)
                self.received = int(kwargs.get("initial") or 0)

            def update(self, n: float | None = 1) -> bool | None:
                if job.cancel_event.is_set():
                    raise Cancelled()
                self.received += int(n or 0)
                job.progress.emit(Progress(done + self.received, total, current))
                return None

        self.folder.mkdir(parents=True, exist_ok=True)
        for current, size in files:
            if self.cancel_event.is_set():
                raise Cancelled()
            self.progress.emit(Progress(done, total, current))
            hf_hub_download(self.repo_id, current, revision=info.sha, local_dir=self.folder,
                            endpoint=self.endpoint, tqdm_class=Bar)
            done += size
        self.progress.emit(Progress(total, total, ""))
        return str(self.folder)


class _ConfigJob(QThread):
    """config.json alone (backend.api.hub_config), so the estimate shows before the weights are pulled."""

    def __init__(self, repo_id: str, endpoint: str | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo_id, self.endpoint = repo_id, endpoint
        self.result_path = ""
        self.error = ""

    def run(self) -> None:
        try:
            self.result_path = str(fetch_model_config(HUB_PREFIX + self.repo_id, self.endpoint).parent)
        except ValueError as exc:  # one line: offline, no such model, no network
            self.error = str(exc)


class HubDownload(QObject):
    """`start(repo_id)` downloads in a thread; `progress`, then `finished(folder)` or `failed(reason)`."""

    progress = Signal(object)
    """Progress(done, total, file) while files arrive."""
    finished = Signal(str)
    """The local folder holding the complete model."""
    failed = Signal(str)
    """One line: why it stopped ("cancelled" when the person cancelled)."""
    config_fetched = Signal(str)
    """The model's download folder, now holding its config.json (fetch_config)."""

    def __init__(self, endpoint: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.endpoint = endpoint
        """None: huggingface_hub's own (HF_ENDPOINT or huggingface.co); tests point it at a fake."""
        self._job: _Job | _ConfigJob | None = None

    def is_running(self) -> bool:
        return self._job is not None and self._job.isRunning()

    def start(self, repo_id: str) -> None:
        if self.is_running():
            return
        job = _Job(repo_id, self.endpoint, target_folder(repo_id), self)
        job.progress.connect(self.progress)
        job.finished.connect(lambda: self._on_job_finished(job))
        self._job = job
        job.start()

    def fetch_config(self, repo_id: str) -> None:
        """Fetch only `repo_id`'s config.json into its download folder (the full download reuses it)."""
        if self.is_running():
            return
        job = _ConfigJob(repo_id, self.endpoint, self)
        job.finished.connect(lambda: self._on_job_finished(job))
        self._job = job
        job.start()

    def cancel(self) -> None:
        if isinstance(self._job, _Job):
            self._job.cancel_event.set()

    def wait(self, ms: int = 30_000) -> bool:
        """Block until the thread ends (closing the window; tests)."""
        return self._job.wait(ms) if self._job is not None else True

    def _on_job_finished(self, job: _Job | _ConfigJob) -> None:
        if job is not self._job:
            return
        self._job = None
        if job.error:
            self.failed.emit(job.error)
        elif isinstance(job, _ConfigJob):
            self.config_fetched.emit(job.result_path)
        else:
            self.finished.emit(job.result_path)
