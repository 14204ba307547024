"""The one place where whatever reaches the top of a CLI command becomes one line and an exit code.

main() parses and runs every subcommand through `run_guarded`, so a new command cannot forget it:
bad input (ConfigError, JobError, a command-line mistake, a path the user named) exits 2; anything
else exits 1 with "internal error: ..." and the traceback kept in the run's worker.log or in
<studio home>/logs/cli.log, whose path the line names; Ctrl-C exits 130. Torch-free.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import tempfile
import time
import traceback
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Callable

from backend.core.config.run_config import ConfigError
from backend.core.errors import JobError
from backend.core.paths import usable_home

BAD_INPUT = 2
INTERNAL = 1
INTERRUPTED = 130

_FIXES = {
    errno.EACCES: "check its permissions",
    errno.EPERM: "check its permissions",
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder; give a file",
    errno.ENAMETOOLONG: "use a shorter name",
    errno.ENOSPC: "free some space",
    errno.EROFS: "pick a folder on a writable disk",
}


class UsageError(ConfigError):
    """A command-line mistake argparse found, carried with its hint instead of argparse's usage dump."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class Refusals(ConfigError):
    """Every reason a run cannot start, said together: one `error:` line each, then one hint."""

    def __init__(self, lines: list[str], hint: str = "") -> None:
        super().__init__("; ".join(lines))
        self.lines = lines
        self.hint = hint


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose mistakes are one line and a hint, not a usage block (subparsers inherit it)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        guess = get_close_matches(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)), n=1) if choice else []
        hint = f"did you mean {guess[0]}? " if guess else ""
        raise UsageError(message, hint + f"`{self.prog} --help` lists what it takes")


def run_guarded(argv: list[str], build_parser: Callable[[], argparse.ArgumentParser]) -> int:
    """Parse argv and run its command; every exception becomes one line on stderr and an exit code."""
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return INTERRUPTED
    except Refusals as exc:
        for line in exc.lines:
            say(line)
        if exc.hint:
            say_hint(exc.hint)
        return BAD_INPUT
    except UsageError as exc:
        say(str(exc), unrecognized_hint(str(exc), argv) or exc.hint)
        return BAD_INPUT
    except BrokenPipeError:  # whoever read the output went away (`| head`): nothing left to say
        _stdout_to_devnull()
        return INTERNAL
    except (ConfigError, JobError) as exc:
        hint = getattr(exc, "hint", "")
        say(str(getattr(exc, "message", exc)), hint)
        return BAD_INPUT
    except OSError as exc:
        users = is_users_path(exc, argv)
        where = keep_traceback(args, argv)
        say(describe_os_error(exc) + ("" if users else f"; details in {where}"))
        return BAD_INPUT if users else INTERNAL
    except Exception as exc:  # noqa: BLE001 - the promise: never a traceback on the terminal
        where = keep_traceback(args, argv)
        say(f"internal error: {type(exc).__name__}: {first_line(str(exc))}; details in {where}")
        return INTERNAL


def _stdout_to_devnull() -> None:
    """So that Python's own flush of stdout at exit does not print a second broken-pipe traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def unrecognized_hint(message: str, argv: list[str]) -> str:
    """For options a command does not have: the subcommand's --help, and `--set` where the option
    is a config field (`--max-steps 3` -> `--set train.max_steps=3`)."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    from backend.core.config.run_config import field_paths

    words = message.split(":", 1)[1].split()
    command = next((a for a in argv if not a.startswith("-")), "")
    names = [path.rsplit(".", 1)[-1] for path in field_paths()]
    leaves = {name: path for name, path in zip(names, field_paths()) if names.count(name) == 1}
    for i, word in enumerate(words):
        key = word.lstrip("-").partition("=")[0].replace("-", "_")
        if word.startswith("--") and key in leaves:
            value = word.partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "VALUE")
            return f"did you mean --set {leaves[key]}={value}? (config fields are set with --set)"
    return f"`finetune-studio {command} --help` lists what it takes" if command else ""


def say(message: str, hint: str = "") -> None:
    """The error line (and its hint line): always one line each, whatever the message held."""
    print(f"error: {first_line(message, join=True)}", file=sys.stderr)
    if hint:
        say_hint(hint)


def say_hint(hint: str) -> None:
    print(f"hint: {first_line(hint, join=True)}", file=sys.stderr)


def first_line(text: str, join: bool = False, limit: int = 500) -> str:
    """A message as one line: its lines joined (or the first kept), cut at `limit` characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or [""]
    line = "; ".join(lines) if join else lines[0]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def describe_os_error(exc: OSError) -> str:
    """`path: what the system said; the fix` (both paths for a rename or a link)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    fix = _FIXES.get(exc.errno or 0, "")
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    text = f"{' -> '.join(names)}: {reason}" if names else reason
    return f"{text}; {fix}" if fix else text


def is_users_path(exc: OSError, argv: list[str]) -> bool:
    """Whether the failing path is one the user named (on the command line, or the studio home)."""
    if exc.filename is None:
        return False
    try:
        failing = Path(os.fsdecode(exc.filename)).expanduser().absolute()
    except (TypeError, ValueError):
        return False
    named = [part for arg in argv for part in (arg, arg.partition("=")[2]) if part]
    home = os.environ.get("FINETUNE_STUDIO_HOME")
    for text in named + ([home] if home else []):
        try:
            given = Path(text).expanduser().absolute()
        except (TypeError, ValueError):
            continue
        if failing == given or given in failing.parents:
            return True
    return False


def keep_traceback(args: argparse.Namespace | None, argv: list[str]) -> str:
    """Append the current traceback to the run's worker.log, else <studio home>/logs/cli.log (a temp
    folder when the home is unusable, said in the returned text); returns where it went."""
    folder = getattr(args, "run_folder", None) if args is not None else None
    note = ""
    if folder is not None and Path(folder).is_dir():
        path = Path(folder) / "worker.log"
    else:
        try:
            path = usable_home() / "logs" / "cli.log"
            path.parent.mkdir(parents=True, exist_ok=True)
        except (JobError, OSError) as exc:
            path = Path(tempfile.gettempdir()) / "finetune-studio-logs" / "cli.log"
            note = f" (the data directory is unusable: {first_line(str(getattr(exc, 'message', exc)))})"
    entry = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} finetune-studio {' '.join(argv)}\n"
             f"{traceback.format_exc()}\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(entry)
    except OSError as exc:
        return f"nowhere: the log {path} cannot be written ({exc.strerror or exc}){note}"
    return f"{path}{note}"
