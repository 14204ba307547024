"""JOBS: each JobKind to its `run_<job>` function, by real reference, each job imported only when it runs.

The jobs import torch and their libraries at module level, and a worker runs one job, so each entry is
a small function that imports its job and returns its run function: the worker loads only the job it
runs, and a search for `run_export` finds its caller here. tests/backend/test_job_table.py checks that
the table covers exactly `JobKind` and that importing it loads no job.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from backend.core.protocol import JobKind

if TYPE_CHECKING:
    from backend.core.config.run_config import RunConfig
    from backend.core.protocol import Capabilities
    from backend.runtime.reporter import Reporter
    from backend.runtime.stop_listener import StopListener


class JobRun(Protocol):
    """What the worker calls (backend/worker/runner.py): every job takes the same arguments."""

    def __call__(self, config: RunConfig, run_dir: Path, reporter: Reporter, stop: StopListener, *,
                 resume: bool = False, capabilities: Capabilities | None = None,
                 params: dict | None = None) -> None: ...


def _finetune() -> JobRun:
    from backend.jobs.finetune import run_finetune

    return run_finetune


def _evaluate() -> JobRun:
    from backend.jobs.evaluate import run_evaluate

    return run_evaluate


def _export() -> JobRun:
    from backend.jobs.export import run_export

    return run_export


def _chat() -> JobRun:
    from backend.jobs.chat import run_chat

    return run_chat


def _prune() -> JobRun:
    from backend.jobs.prune import run_prune

    return run_prune


JOBS: dict[JobKind, Callable[[], JobRun]] = {
    "finetune": _finetune,
    "evaluate": _evaluate,
    "export": _export,
    "chat": _chat,
    "prune": _prune,
}
"""JobKind -> a function that imports that job and returns its run function: `JOBS[kind]()(config, ...)`."""
