"""Run folders: config, events, checkpoints and each run's summary. Torch-free: the studio and CLI use it.

The folders are the truth; the index (run_index.py) is a cache for the Runs page that
`RunIndex.sync()` rebuilds from them, so a crashed studio or a hand-deleted folder never leaves the
list lying.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from backend.core.config.run_config import RunConfig
from backend.core.paths import usable_home

NAME_TRIES = 8
"""Random suffixes tried before RunFolder.create gives up (one in 65,536 collides in the same second)."""
STARTED_ANYWAY = "started_anyway.json"
"""Written when a person started a run over a blocking verdict they may override (the estimate over memory)."""
CHECKPOINT_MARKER = "checkpoint_complete.json"
"""Written last, after an fsync of everything else: a checkpoint without it does not count."""
EXPORTS_RECORD = "exports.json"
"""Where each export of the run was written, newest last: `export --out` may put one anywhere."""


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    path: str
    name: str
    created: float
    status: str
    steps: int
    final_loss: float | None
    tokens_per_s: float | None
    model: str
    method: str
    reason: str = ""
    """Why a failed or cancelled run ended (its JobFailed message), "" otherwise."""


COLUMNS = ("run_id", "path", "name", "created", "status", "steps", "final_loss", "tokens_per_s", "model", "method",
           "reason")


def status_of(terminal: dict[str, Any] | None) -> str:
    """A run's status word from the last word of its newest fine-tune attempt (None: none yet)."""
    if terminal is None:
        return "incomplete"
    if terminal["type"] == "JobFinished":
        return "stopped" if terminal.get("stopped") else "finished"
    return "cancelled" if terminal.get("kind") == "cancelled" else "failed"


class RunFolder:
    """One run: config.yaml, events.jsonl, worker.log, checkpoints/, adapter/, exports/."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # --- layout -----------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def log_path(self) -> Path:
        return self.path / "worker.log"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def adapter_dir(self) -> Path:
        return self.path / "adapter"

    # --- creation ---------------------------------------------------------------------------
    @classmethod
    def create(cls, config: RunConfig, root: Path | None = None) -> "RunFolder":
        root = root or usable_home() / "runs"
        root.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", config.name).strip("-")[:40] or "run"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for _ in range(NAME_TRIES):  # two runs of one name in one second share the stamp: the suffix differs
            path = root / f"{stamp}-{slug}-{secrets.token_hex(2)}"
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"{root}: {NAME_TRIES} run folder names for {slug} at {stamp} are all taken")
        folder = cls(path)
        absolute_paths(config).save(folder.config_path)
        folder.events_path.touch()
        return folder

    def record_started_anyway(self, lines: list[str]) -> None:
        """Say in the folder that the run was started over these verdicts, so a failure later reads as
        the risk that was taken, not as a fault of the studio's estimate."""
        record = {"started_anyway": True, "verdicts": lines, "time": time.time()}
        (self.path / STARTED_ANYWAY).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    def load_config(self) -> RunConfig:
        return RunConfig.load(self.config_path)

    # --- events -----------------------------------------------------------------------------
    def iter_events(self) -> Iterator[dict[str, Any]]:
        """Events as dicts; a torn last line (the worker died mid-write) is skipped."""
        try:
            with self.events_path.open(encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(item, dict):
                        yield item
        except FileNotFoundError:
            return

    def append_event(self, event: dict[str, Any]) -> None:
        """Used by a client to record what the worker could not (it died before its last word)."""
        with self.events_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")

    def terminal_event(self) -> dict[str, Any] | None:
        """The last word of the newest fine-tune attempt; exports and evaluations do not count."""
        last = None
        job = "finetune"
        for event in self.iter_events():
            kind = event.get("type")
            if kind == "JobStarted":
                job = event.get("job", "finetune")
                if job == "finetune":
                    last = None  # a resume starts a new attempt
            elif kind in ("JobFinished", "JobFailed") and job == "finetune":
                last = event
        return last

    def status(self) -> str:
        """finished | stopped | failed | cancelled | incomplete (no final event: running or lost)."""
        return status_of(self.terminal_event())

    def metrics(self) -> list[dict[str, Any]]:
        return [e for e in self.iter_events() if e.get("type") == "MetricsLogged"]

    # --- exports ----------------------------------------------------------------------------
    def recorded_exports(self) -> list[dict[str, Any]]:
        """The exports the export job recorded ({"format", "path", "time"}), oldest first; an unreadable
        record reads as none (the default exports/FORMAT folders are still looked at)."""
        try:
            entries = json.loads((self.path / EXPORTS_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        if not isinstance(entries, list):
            return []
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("format"), str)
                and isinstance(e.get("path"), str)]

    def record_export(self, fmt: str, path: Path) -> None:
        """Note that a `fmt` export now lies in `path` (replacing an earlier note of that folder), so
        `serve` and `serve-estimate` find it wherever --out put it. Written whole or not at all."""
        entries = [e for e in self.recorded_exports() if e["path"] != str(path)]
        entries.append({"format": fmt, "path": str(path), "time": time.time()})
        tmp = self.path / f".{EXPORTS_RECORD}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, self.path / EXPORTS_RECORD)

    # --- checkpoints ------------------------------------------------------------------------
    def complete_checkpoints(self) -> list[Path]:
        """Checkpoints whose marker exists, oldest first."""
        if not self.checkpoints_dir.is_dir():
            return []
        found = []
        for child in self.checkpoints_dir.iterdir():
            match = re.fullmatch(r"checkpoint-(\d+)", child.name)
            if match and (child / CHECKPOINT_MARKER).is_file():
                found.append((int(match.group(1)), child))
        return [p for _, p in sorted(found)]

    def remove_incomplete_checkpoints(self) -> list[Path]:
        """Delete checkpoint folders without a marker (a save cut short); they can never be resumed."""
        removed = []
        if self.checkpoints_dir.is_dir():
            for child in self.checkpoints_dir.iterdir():
                if child.is_dir() and not (child / CHECKPOINT_MARKER).is_file():
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
        return removed

    def latest_checkpoint(self) -> Path | None:
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def tail_log(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def summary(self) -> RunSummary:
        """The Runs table's row, from one pass over events.jsonl (a long run's file is read once)."""
        steps, final_loss, tps = 0, None, None
        job = "finetune"
        terminal: dict[str, Any] | None = None
        for event in self.iter_events():
            kind = event.get("type")
            if kind == "JobStarted":
                job = event.get("job", "finetune")
                if job == "finetune":
                    terminal = None  # as terminal_event(): a resume starts a new attempt
            elif job != "finetune":
                continue  # exports, evaluations and chats do not change the run's figures
            elif kind == "MetricsLogged":
                steps = event.get("step", steps)
                final_loss = event.get("loss", final_loss) if event.get("loss") is not None else final_loss
            elif kind == "JobFinished":
                tps = event.get("tokens_per_s")
                final_loss = event.get("final_loss", final_loss)
            if kind in ("JobFinished", "JobFailed") and job == "finetune":
                terminal = event
        model = method = ""
        try:
            config = self.load_config()
            model, method, name = config.model.path, config.technique.method, config.name
            if config.technique.objective != "sft":
                method = f"{method} {config.technique.objective}"  # "lora dpo": the Runs table tells them apart
        except Exception:  # a broken config still lists, by folder name
            name = self.run_id
        created = self.path.stat().st_mtime if self.path.exists() else 0.0
        try:
            created = self.config_path.stat().st_mtime
        except OSError:
            pass
        reason = str(terminal.get("message", "")) if terminal and terminal.get("type") == "JobFailed" else ""
        return RunSummary(self.run_id, str(self.path), name, created, status_of(terminal), steps,
                          final_loss, tps, model, method, reason)


def absolute_paths(config: RunConfig) -> RunConfig:
    """The config with relative model and data paths made absolute, so the run folder's config.yaml
    still finds them from another working directory (eval, chat, export, resume from elsewhere)."""
    changes: dict[str, Any] = {}
    for section in ("model", "data"):
        value = getattr(config, section).path
        if value and ":" not in value.split("/")[0] and not Path(value).is_absolute() and Path(value).exists():
            changes[section] = getattr(config, section).model_copy(update={"path": str(Path(value).resolve())})
    rewards = [r.model_copy(update={"file": str(Path(r.file).resolve())})
               if r.file and not Path(r.file).is_absolute() and Path(r.file).exists() else r for r in config.grpo.rewards]
    if rewards != config.grpo.rewards:  # the person's reward file, as data.path
        changes["grpo"] = config.grpo.model_copy(update={"rewards": rewards})
    return config.model_copy(update=changes) if changes else config


def fsync_tree(path: Path) -> None:
    """Flush every file (and folder entry) under path to disk before a marker is written."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        try:
            fd = os.open(root, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def mark_checkpoint_complete(path: Path, step: int) -> None:
    fsync_tree(path)
    marker = path / CHECKPOINT_MARKER
    tmp = path / (CHECKPOINT_MARKER + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump({"step": step, "time": time.time()}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, marker)
