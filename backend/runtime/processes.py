"""How a process of ours is started (argv, environment) and whether it still runs. Torch-free.

The window, the CLI, the serve command and accelerate's ranks all start our processes through these, so
a job started from the window and one started from a terminal run the very same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from backend.core.cpu_features import RUNTIME_ENV
from backend.runtime.hub_kernels import switch_off


ISOLATED = ("import sys; sys.path[:] = [p for p in sys.path if p]; import runpy; "
            "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
"""`python -c ISOLATED MODULE ARGS...` runs MODULE as `python -m` would, without the current folder on
sys.path: `-m` puts the folder a command was started in first, so a `backend/` package there would
run instead of ours (`-P` does this from Python 3.11 only). The package root comes from PYTHONPATH."""

WORKER_SCRIPT = Path(__file__).resolve().parent.parent / "worker" / "__main__.py"
"""The worker as a script, for launchers that start their ranks with `python SCRIPT` (accelerate)."""


def module_command(module: str, python: str | None = None) -> list[str]:
    """argv that runs `module` like `python -m module`, never importing from the current folder. In a
    frozen (PyInstaller) bundle, `<bundle> -m module`: its entry (packaging/pyinstaller) runs `-m` from
    the bundle's own imports and knows no `-c`."""
    if python is None and getattr(sys, "frozen", False):
        return [sys.executable, "-m", module]
    return [python or sys.executable, "-c", ISOLATED, module]


def worker_command(python: str | None = None) -> list[str]:
    """argv of a worker process: `backend.worker` run as a module (module_command), or `<bundle>
    --worker` in a frozen (PyInstaller) bundle, whose sys.executable is the bundle itself and knows no
    `-m` (its imports come from the bundle alone)."""
    if python is None and getattr(sys, "frozen", False):
        return [sys.executable, "--worker"]
    return module_command("backend.worker", python)


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the worker.

    RUNTIME_ENV (cpu_features.py): passive OpenMP waits, and bounded oneDNN kernel caches.
    HF_HUB_OFFLINE keeps the worker off the network unless the user asks for a download; Hub kernels are
    off whatever the caller's environment says (hub_kernels.py).
    """
    env = dict(os.environ if base is None else base)
    for name, value in RUNTIME_ENV.items():
        env.setdefault(name, value)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    switch_off(env)
    env["PYTHONUNBUFFERED"] = "1"
    env["FINETUNE_STUDIO_CLIENT_PID"] = str(os.getpid())  # the worker ends with us (worker/parent_watch.py)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def alive(pid: int) -> bool:
    """Whether a process still runs: the worker's watch on its client and the export's lock both ask it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True
