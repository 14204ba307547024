"""RunIndex: the SQLite cache of run summaries behind the Runs page and `finetune-studio runs`.

The run folders are the truth; the index keeps each run's summary with the (mtime, size) of the
events.jsonl it was read from, so a sync (every time the Runs page is shown, and the first one of a
new session too) re-reads only the runs whose events changed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from backend.core.paths import usable_home
from backend.core.runs.run_folder import COLUMNS, RunFolder, RunSummary

SUMMARY_VERSION = 1
"""Raised when RunFolder.summary() reads a run differently: every stored row is then read again."""


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
            # Each row's events.jsonl (mtime, size) when it was read: a new session re-reads only
            # the runs that changed, not every run's whole event file.
            db.execute("CREATE TABLE IF NOT EXISTS stamps (run_id TEXT PRIMARY KEY, mtime REAL, size INTEGER)")
            if db.execute("PRAGMA user_version").fetchone()[0] != SUMMARY_VERSION:  # rows read the older way
                with db:
                    db.execute("DELETE FROM stamps")
                    db.execute(f"PRAGMA user_version = {SUMMARY_VERSION}")
            self._seen = {run_id: (mtime, size) for run_id, mtime, size in db.execute(
                "SELECT stamps.run_id, mtime, size FROM stamps JOIN runs ON runs.run_id = stamps.run_id")}
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

    def update(self, folder: RunFolder, stamp: tuple[float, int] | None = None) -> RunSummary:
        s = folder.summary()
        return self._guarded(lambda: self._write([(s, stamp)]))[0]

    def _write(self, rows: list[tuple[RunSummary, tuple[float, int] | None]]) -> list[RunSummary]:
        """The rows (with the events stamp they were read at) in one transaction: one commit, not one a run."""
        with self._db:
            for s, stamp in rows:
                self._db.execute(
                    "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (s.run_id, s.path, s.name, s.created, s.status, s.steps, s.final_loss,
                     s.tokens_per_s, s.model, s.method, s.reason),
                )
                if stamp is None:
                    self._db.execute("DELETE FROM stamps WHERE run_id = ?", (s.run_id,))
                else:
                    self._db.execute("INSERT OR REPLACE INTO stamps VALUES (?,?,?)", (s.run_id, *stamp))
        return [s for s, _ in rows]

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
        changed: list[tuple[RunSummary, tuple[float, int]]] = []
        for child in self.root.iterdir():
            try:
                if not (child.is_dir() and (child / "config.yaml").exists()):
                    continue
                ids.add(child.name)
                stamp = self._stamp(child)
                if self._seen.get(child.name) != stamp:
                    changed.append((RunFolder(child).summary(), stamp))
            except OSError as exc:
                ids.add(child.name)
                self.unreadable.append(f"{child}: {exc.strerror or exc}")
        if changed:
            self._guarded(lambda: self._write(changed))
            self._seen.update((s.run_id, stamp) for s, stamp in changed)
        return ids

    def _drop_missing(self, ids: set[str]) -> None:
        with self._db:
            for (run_id,) in self._db.execute("SELECT run_id FROM runs").fetchall():
                if run_id not in ids:
                    self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
                    self._db.execute("DELETE FROM stamps WHERE run_id = ?", (run_id,))
                    self._seen.pop(run_id, None)

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
            self._db.execute("DELETE FROM stamps WHERE run_id = ?", (run_id,))
        self._seen.pop(run_id, None)
