"""run_worker: handshake, one StartJob, the job, and the one-line failure for anything that breaks.

Every exception ends here. The person sees `JobFailed{kind, message, hint}` with one sentence; the
traceback goes to worker.log in the run folder, where a bug report can pick it up.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import IO

from backend.core.config.run_config import RunConfig
from backend.core.protocol import JobFailed, ProtocolError, StartJob, WorkerReady, decode_command
from backend.jobs.table import JOBS
from backend.runtime.reporter import Reporter
from backend.worker.failures import classify_failure
from backend.worker.parent_watch import ParentWatch
from backend.runtime.stop_listener import StopListener

log = logging.getLogger("backend.worker")


def rank() -> int:
    """This process' global rank under `accelerate launch` (0 when launched alone)."""
    return int(os.environ.get("RANK", "0"))


def _log_to_run_folder(run_dir: Path) -> None:
    """Point fd 2 (and so fd 1's chatter) at worker.log: library noise is kept, not shown.

    Under `accelerate launch` every rank logs to its own file; only rank 0 reports events."""
    name = "worker.log" if rank() == 0 else f"worker-rank{rank()}.log"
    handle = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(handle, 2)
    os.dup2(handle, 1)
    os.close(handle)


def _configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank()} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    logging.captureWarnings(True)
    warnings.simplefilter("default")


def run_worker(stdin: IO[str], protocol_out: IO[str], job_file: Path | None = None) -> int:
    _configure_logging()
    main = rank() == 0
    reporter = Reporter(protocol_out if main else io.StringIO())  # one voice: rank 0
    from backend.training.model.capabilities import probe_capabilities

    capabilities = probe_capabilities()
    reporter.emit(WorkerReady(pid=os.getpid(), capabilities=capabilities))

    # Ranks share one stdin, so under `accelerate launch` the StartJob comes from a file.
    line = job_file.read_text(encoding="utf-8") if job_file else stdin.readline()
    if not line:
        log.error("stdin closed before a StartJob arrived")
        return 2
    try:
        command = decode_command(line)
        if not isinstance(command, StartJob):
            raise ProtocolError(f"expected StartJob first, got {command.type}")
    except ProtocolError as exc:
        reporter.emit(JobFailed(kind="bad_input", message=str(exc), hint="start the worker from the studio or CLI"))
        return 2

    run_dir = Path(command.run_dir)
    if not run_dir.is_dir():
        reporter.emit(JobFailed(kind="bad_input", message=f"run folder {run_dir} does not exist"))
        return 2
    _log_to_run_folder(run_dir)
    _configure_logging()
    if main:
        reporter.attach_run(run_dir)
    stop = StopListener(stdin).start()
    ParentWatch(stop).start()  # a closed terminal or a killed client: stop and save, never run on detached
    log.info("worker %s starting %s job in %s (resume=%s)", os.getpid(), command.job, run_dir, command.resume)

    config = None
    try:
        config = RunConfig.from_dict(command.config, source=str(run_dir / "config.yaml"))
        set_up_torch(config)
        job = JOBS[command.job]()  # imports this job alone (backend/jobs/table.py)
        job(config, run_dir, reporter, stop, resume=command.resume, capabilities=capabilities, params=command.params)
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one JobFailed line
        failure = classify_failure(exc, config, run_dir)
        log.error("job failed: %s\n%s", failure.message, traceback.format_exc())
        reporter.emit(failure)
        return 1
    finally:
        reporter.close()


def set_up_torch(config: RunConfig) -> None:
    """What every job needs the same way: thread count and quiet libraries."""
    import torch
    from transformers.utils import logging as hf_logging

    from backend.training.model.capabilities import default_threads

    hf_logging.set_verbosity_warning()
    # Ranks on one machine share its cores; each keeps to its share.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(config.train.cpu_threads or max(1, default_threads() // local))

