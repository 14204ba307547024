"""A worker from another release: it announces another protocol version, then waits for a StartJob
that a client must never send. `--how field` says it in WorkerReady.protocol_version, `--how message`
in the message's own `v`. Used to prove both clients refuse it in one line, at once."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backend.core.protocol import PROTOCOL_VERSION  # noqa: E402


def main() -> int:
    other = PROTOCOL_VERSION + 1
    how = sys.argv[sys.argv.index("--how") + 1] if "--how" in sys.argv else "field"
    ready = {"type": "WorkerReady", "v": PROTOCOL_VERSION, "protocol_version": other, "pid": 0}
    if how == "message":
        ready["v"] = other
    sys.stdout.write(json.dumps(ready) + "\n")
    sys.stdout.flush()
    if sys.stdin.readline():
        sys.stderr.write("a StartJob was sent to a worker of another release\n")
        return 3
    time.sleep(30)  # what the CLI used to wait out before it said "crashed (exit code 0)"
    return 0


if __name__ == "__main__":
    sys.exit(main())
