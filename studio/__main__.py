"""`finetune-studio`: no arguments opens the window; a subcommand runs the headless CLI.

Both live behind one entry point so a server without a screen runs the very same jobs. Qt and the
CLI are imported only inside their branch, so each path loads only what it needs.
"""

from __future__ import annotations

import os
import sys

NO_DISPLAY = ("finetune-studio: no display found (DISPLAY and WAYLAND_DISPLAY are unset); to train "
              "without a window run: finetune-studio train resources/presets/tiny_lora.yaml")


def _wants_cli(argv: list[str]) -> bool:
    """A subcommand (an argument not starting with "-") or a request for help goes to the CLI."""
    return any(not arg.startswith("-") or arg in ("--help", "-h") for arg in argv)


def _has_display() -> bool:
    if not sys.platform.startswith("linux"):
        return True
    env = os.environ
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY") or env.get("QT_QPA_PLATFORM"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        # `finetune-studio --worker`: the worker (backend/runtime/processes.py worker_command). This process
        # becomes `python -m backend.worker`, so the studio package never imports the worker or torch;
        # a frozen bundle's entry (packaging/pyinstaller) runs its worker before reaching this module.
        return _become_worker(argv[1:])
    if _wants_cli(argv):
        from backend.cli.app import main as cli_main

        return cli_main(argv)
    if not _has_display():
        print(NO_DISPLAY, file=sys.stderr)
        return 2
    home_problem = _home_problem()
    if home_problem:
        return _refuse_to_open(home_problem)
    from studio.app import run_app

    return run_app(argv)


def _become_worker(rest: list[str]) -> int:
    """Replace this process with the worker (a child where exec is not POSIX), with the same stdin and stdout."""
    command = [sys.executable, "-m", "backend.worker", *rest]
    sys.stdout.flush()
    if os.name == "posix":
        os.execv(sys.executable, command)
    import subprocess

    return subprocess.call(command)


def _home_problem() -> str:
    """Why the studio's data directory cannot be used ("" when it can): said before the window is built."""
    from backend.core.errors import JobError
    from backend.core.paths import usable_home

    try:
        usable_home()
    except JobError as exc:
        return f"{exc.message}; {exc.hint}" if exc.hint else exc.message
    return ""


def _refuse_to_open(problem: str) -> int:
    """One line on stderr and in a dialog (a launcher from the desktop menu has no terminal), exit 2."""
    print(f"finetune-studio: {problem}", file=sys.stderr)
    from PySide6.QtWidgets import QApplication, QMessageBox

    app = QApplication.instance() or QApplication([sys.argv[0]])
    if os.environ.get("QT_QPA_PLATFORM") != "offscreen":
        QMessageBox.critical(None, "Finetune Studio cannot start", problem[0].upper() + problem[1:] + ".")
    del app
    return 2


if __name__ == "__main__":
    sys.exit(main())
