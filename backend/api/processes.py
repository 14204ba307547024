"""Whether a process still runs: the worker's watch on its client and the export's lock both ask it."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
