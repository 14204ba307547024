"""`python -m backend.worker`: one process, one job.

Order matters here. The protocol stream is taken from fd 1 before anything else runs, and fd 1 is
then pointed at stderr, so that no library print (C or Python) can corrupt the JSON lines. Thread
settings go into the environment before torch is imported, because OpenMP reads them only once.
"""

from __future__ import annotations

import os
import sys

if not __package__:  # run as a script (accelerate's ranks): this folder is on sys.path, the package root is not
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.dirname(os.path.realpath(__file__))]


def _take_protocol_stream():
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def main() -> int:
    protocol_out = _take_protocol_stream()
    from backend.runtime.processes import worker_env  # torch-free: one definition of the worker's environment

    client = os.environ.get("FINETUNE_STUDIO_CLIENT_PID")  # who started us: kept, not replaced by our own pid
    os.environ.update(worker_env())  # a worker started by hand gets what launch gives the others
    if client:
        os.environ["FINETUNE_STUDIO_CLIENT_PID"] = client
    else:
        os.environ.pop("FINETUNE_STUDIO_CLIENT_PID", None)
    from pathlib import Path

    from backend.worker.runner import run_worker

    job_file = None
    if "--job-file" in sys.argv:
        job_file = Path(sys.argv[sys.argv.index("--job-file") + 1])
    try:
        return run_worker(sys.stdin, protocol_out, job_file)
    finally:
        protocol_out.close()


if __name__ == "__main__":
    sys.exit(main())
