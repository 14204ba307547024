"""A worker that hangs: it starts a job, then ignores StopJob and SIGTERM (a stuck CUDA call looks
like this from outside). Used to prove the studio's stop -> terminate -> kill escalation."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backend.core.protocol import JobStarted, MetricsLogged, WorkerReady, decode_command, encode  # noqa: E402


def main() -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN if "--ignore-term" in sys.argv else signal.SIG_DFL)
    out = sys.stdout
    out.write(encode(WorkerReady(pid=0)))
    out.flush()
    start = decode_command(sys.stdin.readline())
    out.write(encode(JobStarted(run_dir=start.run_dir, max_steps=100)))
    out.write(encode(MetricsLogged(step=1, max_steps=100, loss=2.0)))
    out.flush()
    while True:  # never reads stdin again, never finishes
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
