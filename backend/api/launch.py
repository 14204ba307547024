"""How a client starts a job: the worker's argv (plain, or under `accelerate launch`) and its StartJob line.

The studio (through QProcess) and the CLI (through subprocess) both call these, so a job started from the
window and one started from a terminal run the very same way. The process-level pieces (argv of a module,
the worker's environment) live in backend.runtime.processes and are handed on here for the clients.
"""

from __future__ import annotations

import sys

from backend.core.config.run_config import RunConfig
from backend.core.protocol import StartJob, encode
from backend.core.runs.run_folder import RunFolder
from backend.runtime.processes import module_command, worker_command, worker_env

__all__ = ["job_argv", "module_command", "start_line", "worker_command", "worker_env"]


def start_line(folder: RunFolder, config: RunConfig, resume: bool = False, job: str = "finetune",
               params: dict | None = None) -> str:
    """The StartJob line to write to a fresh worker's stdin."""
    return encode(StartJob(job=job, run_dir=str(folder.path), config=config.model_dump(mode="json"),
                           resume=resume, params=params or {}))


def job_argv(folder: RunFolder, config: RunConfig, resume: bool = False, job: str = "finetune",
             params: dict | None = None, machine_rank: int = 0, python: str | None = None) -> list[str]:
    """argv for one job: the plain worker, or the worker under `accelerate launch` when the run's
    hardware section asks for several processes (then every rank reads the StartJob from a file)."""
    if job != "finetune" or not config.hardware.distributed:
        return worker_command(python)
    from backend.api.distributed import launch_argv, write_launch_files

    config_file, job_file = write_launch_files(folder.path, config, start_line(folder, config, resume, job, params),
                                               machine_rank)
    return launch_argv(python or sys.executable, folder.path, config_file, job_file)
