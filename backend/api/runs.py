"""Run folders and the SQLite index of runs. Torch-free: the studio and CLI use it.

The folders are the truth; the index is a cache for the Runs page that `RunIndex.sync()` rebuilds
from them, so a crashed studio or a hand-deleted folder never leaves the list lying.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from backend.config.run_config import RunConfig
from backend.api.paths import usable_home

CHECKPOINT_MARKER = "checkpoint_complete.json"
"""Written last, after an fsync of everything else: a checkpoint without it does not count."""


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
        path = root / f"{stamp}-{slug}-{secrets.token_hex(2)}"
        path.mkdir()
        folder = cls(path)
        absolute_paths(config).save(folder.config_path)
        folder.events_path.touch()
        return folder

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
        event = self.terminal_event()
        if event is None:
            return "incomplete"
        if event["type"] == "JobFinished":
            return "stopped" if event.get("stopped") else "finished"
        return "cancelled" if event.get("kind") == "cancelled" else "failed"

    def metrics(self) -> list[dict[str, Any]]:
        return [e for e in self.iter_events() if e.get("type") == "MetricsLogged"]

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
        steps, final_loss, tps = 0, None, None
        job = "finetune"
        for event in self.iter_events():
            kind = event.get("type")
            if kind == "JobStarted":
                job = event.get("job", "finetune")
            elif job != "finetune":
                continue  # exports, evaluations and chats do not change the run's figures
            elif kind == "MetricsLogged":
                steps = event.get("step", steps)
                final_loss = event.get("loss", final_loss) if event.get("loss") is not None else final_loss
            elif kind == "JobFinished":
                tps = event.get("tokens_per_s")
                final_loss = event.get("final_loss", final_loss)
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
        terminal = self.terminal_event() or {}
        reason = str(terminal.get("message", "")) if terminal.get("type") == "JobFailed" else ""
        return RunSummary(self.run_id, str(self.path), name, created, self.status(), steps,
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


class RunIndex:
    """SQLite cache of run summaries under the studio home; rebuilt from folders by sync().

    Being a cache, an unreadable file (garbage bytes, a half-written page, a folder in its place) is
    moved aside to runs.sqlite.corrupt and rebuilt from the run folders; `rebuilt` says so."""

    def __init__(self, home: Path | None = None):
        self.home = home or usable_home()
        self.root = self.home / "runs"
        self.home.mkdir(parents=True, exist_ok=True)
        self.db_path = self.home / "runs.sqlite"
        self._seen: dict[str, tuple[float, int]] = {}
        self.rebuilds = 0
        self.rebuilt = ""
        """Why the index file was unreadable and rebuilt from the folders ("" when it was fine)."""
        self.unreadable: list[str] = []
        """Run folders the last sync() could not read (each `path: reason`); they are left alone."""
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as exc:
            self._db = self._rebuild(exc)

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path)
        try:
            existing = tuple(row[1] for row in db.execute("PRAGMA table_info(runs)"))
            if existing and existing != COLUMNS:  # an older studio's cache: rebuilt from the folders
                with db:
                    db.execute("DROP TABLE runs")
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError(f"damaged: {problems[0]}")
            db.execute(
                "CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, path TEXT, name TEXT,"
                " created REAL, status TEXT, steps INTEGER, final_loss REAL, tokens_per_s REAL,"
                " model TEXT, method TEXT, reason TEXT)"
            )
        except BaseException:
            db.close()
            raise
        return db

    def _rebuild(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """Move the unreadable index (and its journals) aside and start an empty one; sync() refills it."""
        if "locked" in str(exc):  # another studio is writing it: not damage, nothing to rebuild
            raise exc
        aside = self.db_path.with_name(self.db_path.name + ".corrupt")
        for suffix in ("", "-journal", "-wal", "-shm"):
            source, target = Path(f"{self.db_path}{suffix}"), Path(f"{aside}{suffix}")
            if not source.exists() and not source.is_symlink():
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            os.replace(source, target)
        self._seen.clear()
        self.rebuilds += 1
        self.rebuilt = (f"the run index {self.db_path} was unreadable ({exc}); rebuilt it from the run "
                        f"folders (the old file is kept as {aside.name})")
        return self._open()

    def _guarded(self, action: Any) -> Any:
        """Run one query; on damage found mid-session, rebuild the index once and run it again."""
        try:
            return action()
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc):
                raise
            self._db.close()
            self._db = self._rebuild(exc)
            return action()

    def close(self) -> None:
        self._db.close()

    def update(self, folder: RunFolder) -> RunSummary:
        s = folder.summary()
        return self._guarded(lambda: self._write(s))

    def _write(self, s: RunSummary) -> RunSummary:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (s.run_id, s.path, s.name, s.created, s.status, s.steps, s.final_loss,
                 s.tokens_per_s, s.model, s.method, s.reason),
            )
        return s

    def sync(self) -> list[RunSummary]:
        """Re-read the folders whose events changed since the last sync; drop rows whose folder is
        gone. Unchanged runs cost one stat, so a page that syncs on every show stays quick. A folder
        that cannot be read is listed in `unreadable` and its row (if any) kept."""
        rebuilds = self.rebuilds
        ids = self._sync_folders()
        if self.rebuilds != rebuilds:  # the index was rebuilt halfway: the folders read before are missing
            ids = self._sync_folders()
        self._guarded(lambda: self._drop_missing(ids))
        return self.list()

    def _sync_folders(self) -> set[str]:
        ids: set[str] = set()
        self.unreadable = []
        if not self.root.is_dir():
            return ids
        for child in self.root.iterdir():
            try:
                if not (child.is_dir() and (child / "config.yaml").exists()):
                    continue
                ids.add(child.name)
                stamp = self._stamp(child)
                if self._seen.get(child.name) != stamp:
                    self.update(RunFolder(child))
                    self._seen[child.name] = stamp
            except OSError as exc:
                ids.add(child.name)
                self.unreadable.append(f"{child}: {exc.strerror or exc}")
        return ids

    def _drop_missing(self, ids: set[str]) -> None:
        with self._db:
            for (run_id,) in self._db.execute("SELECT run_id FROM runs").fetchall():
                if run_id not in ids:
                    self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    @staticmethod
    def _stamp(path: Path) -> tuple[float, int]:
        try:
            info = (path / "events.jsonl").stat()
            return info.st_mtime, info.st_size
        except OSError:
            return 0.0, -1

    def list(self) -> list[RunSummary]:
        rows = self._guarded(
            lambda: self._db.execute("SELECT * FROM runs ORDER BY created DESC, run_id DESC").fetchall())
        return [RunSummary(*row) for row in rows]

    def delete(self, run_id: str) -> None:
        row = self._db.execute("SELECT path FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row:
            shutil.rmtree(row[0], ignore_errors=True)
        with self._db:
            self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
