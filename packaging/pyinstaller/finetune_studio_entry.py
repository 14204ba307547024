"""Entry point of the PyInstaller bundle: the studio, the CLI and the worker in one executable.

A frozen bundle has no `python`: `sys.executable` is the bundle's own executable, so whatever the
studio or the CLI starts as "`sys.executable` plus arguments" arrives here. This script turns those
argument shapes back into what a Python interpreter would have run:

    finetune-studio                        the window (studio.__main__.main)
    finetune-studio train CONFIG.yaml ...  the headless CLI (studio.__main__.main -> backend.cli.app)
    finetune-studio --worker [--job-file F]  one worker process (backend.worker.__main__.main)
    finetune-studio [-u ...] -m MODULE ...   `python -m MODULE ...`: what backend/runtime/processes.py asks for
                                           today (`-m backend.worker`), and what `accelerate launch`
                                           / torchrun ask for when they start ranks

The worker branches import neither Qt nor the studio, so a worker starts as lean as
`python -m backend.worker` does.
"""

from __future__ import annotations

import sys

# Interpreter flags that launchers put before `-m` (torchrun uses -u); harmless to skip when frozen.
_PYTHON_FLAGS = {"-u", "-B", "-E", "-s", "-S", "-I", "-O", "-OO", "-b", "-bb", "-q"}


def _run_worker(rest: list[str]) -> int:
    sys.argv = [sys.argv[0], *rest]
    from backend.worker.__main__ import main as worker_main

    return worker_main()


def _run_module(module: str, rest: list[str]) -> int:
    if module == "backend.worker":
        return _run_worker(rest)
    import runpy

    sys.argv = [sys.argv[0], *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main() -> int:
    import multiprocessing

    multiprocessing.freeze_support()  # a frozen multiprocessing child never gets past this line
    argv = sys.argv[1:]
    if argv[:1] == ["--worker"]:
        return _run_worker(argv[1:])
    index = 0
    while index < len(argv) and argv[index] in _PYTHON_FLAGS:
        index += 1
    if index < len(argv) - 1 and argv[index] == "-m":
        return _run_module(argv[index + 1], argv[index + 2:])
    from studio.__main__ import main as studio_main

    return studio_main(argv)


if __name__ == "__main__":
    sys.exit(main())
