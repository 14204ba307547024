"""JobError: a failure a person can act on, carried from deep inside a job to its JobFailed event.

Torch-free, so loaders and validators anywhere can raise it; the worker turns it into one line for
the user and keeps the traceback in worker.log.
"""

from __future__ import annotations

from typing import Any

from backend.core.protocol import FailureKind


class JobError(Exception):
    def __init__(self, kind: FailureKind, message: str, hint: str = "", **details: Any):
        super().__init__(message)
        self.kind: FailureKind = kind
        self.message = message
        self.hint = hint
        self.details = details  # extra JobFailed fields: phase, peak_bytes, predicted_bytes, fix


def bad_input(message: str, hint: str = "") -> JobError:
    return JobError("bad_input", message, hint)
