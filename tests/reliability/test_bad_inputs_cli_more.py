"""The CLI's one top-level guard, and the odd inputs that work and say what they did.

In process with a fake worker: what is tested is the command line's side (what it refuses, says,
keeps and logs), not training.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import backend.cli.app
import backend.cli.eval
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from tests.conftest import PRESET
from tests.reliability.test_bad_inputs_cli import one_line, run_folder

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


class FakeWorker:
    """Records what it was asked to run and answers with a finished (or the given) terminal event."""

    calls: list[dict] = []
    terminal: dict | None = None

    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs

    def run(self, folder, config, resume=False, on_event=None):
        FakeWorker.calls.append({"folder": folder, "config": config, "resume": resume, **self.kwargs})
        if FakeWorker.terminal is not None:
            return FakeWorker.terminal
        return {"type": "JobFinished", "run_dir": str(folder.path), "steps": config.train.max_steps}


@pytest.fixture
def fake_worker(monkeypatch):
    FakeWorker.calls, FakeWorker.terminal = [], None
    monkeypatch.setattr(backend.cli.app, "WorkerProcess", FakeWorker)
    monkeypatch.setattr(backend.cli.eval, "WorkerProcess", FakeWorker)
    return FakeWorker


def output(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return out + err


# --- the guard: one line for whatever a command raises -------------------------------------------

def test_an_internal_error_is_one_line_and_its_traceback_is_kept(monkeypatch, capsys, studio_home):
    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(backend.cli.app, "cmd_runs_list", broken)
    assert main(["runs", "list"]) == 1
    log = studio_home / "logs" / "cli.log"
    assert one_line(*capsys.readouterr()) == f"error: internal error: RuntimeError: boom; details in {log}"
    kept = log.read_text()
    assert "Traceback" in kept and "second line" in kept and "finetune-studio runs list" in kept


def test_an_internal_error_during_a_run_goes_to_its_worker_log(monkeypatch, capsys, fake_worker):
    def crash(self, folder, config, resume=False, on_event=None):
        raise KeyError("lost")

    monkeypatch.setattr(FakeWorker, "run", crash)
    assert main(["train", str(PRESET)]) == 1
    line = one_line("", capsys.readouterr().err.split("\n", 1)[1])  # after the "run folder:" line
    assert line.startswith("error: internal error: KeyError: 'lost'; details in ") and line.endswith("worker.log")
    assert "KeyError" in Path(line.rsplit(" ", 1)[1]).read_text()


def test_a_new_command_cannot_forget_the_guard(monkeypatch, capsys):
    build = backend.cli.app.build_parser

    def with_new_command():
        parser = build()
        sub = next(a for a in parser._actions if a.dest == "command")
        sub.add_parser("brand-new").set_defaults(func=lambda args: {}["missing"])
        return parser

    monkeypatch.setattr(backend.cli.app, "build_parser", with_new_command)
    assert main(["brand-new"]) == 1
    assert "internal error: KeyError: 'missing'" in one_line(*capsys.readouterr())


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(backend.cli.app, "cmd_runs_list", interrupted)
    assert main(["runs", "list"]) == 130
    assert output(capsys).strip() == "interrupted"


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    def reader_gone(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(backend.cli.app, "cmd_runs_list", reader_gone)
    assert main(["runs", "list"]) == 1
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("named, code", [(True, 2), (False, 1)])
def test_an_os_error_names_its_path_and_is_bad_input_on_the_users_path(named, code, tmp_path, monkeypatch, capsys):
    given = tmp_path / "mine"
    failing = given / "config.json" if named else Path("/opt/elsewhere/x")

    def fails(args):
        raise PermissionError(13, "Permission denied", str(failing))

    monkeypatch.setattr(backend.cli.app, "cmd_estimate", fails)
    assert main(["estimate", str(given)]) == code
    line = one_line(*capsys.readouterr())
    assert line.startswith(f"error: {failing}: Permission denied; check its permissions")
    assert ("details in" in line) is not named


def test_no_usable_home_still_keeps_the_traceback(monkeypatch, capsys, tmp_path):
    home = tmp_path / "a_file"
    home.write_text("")
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
    monkeypatch.setattr(backend.cli.app, "cmd_runs_list", lambda args: 1 / 0)
    assert main(["runs", "list"]) == 1
    line = one_line(*capsys.readouterr())
    assert "internal error: ZeroDivisionError" in line and "(the data directory is unusable: " in line
    assert Path(line.split("details in ", 1)[1].split(" (")[0]).is_file()


# --- the run index is a cache: unreadable, it is rebuilt and said -------------------------------

def corrupt_index(home: Path, how: str) -> Path:
    db = home / "runs.sqlite"
    if how == "garbage":
        db.write_bytes(os.urandom(3000))
    elif how == "folder":
        db.mkdir()
    else:  # a real index with a page overwritten
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, path TEXT, name TEXT, created REAL, status TEXT,"
                    " steps INTEGER, final_loss REAL, tokens_per_s REAL, model TEXT, method TEXT, reason TEXT)")
        con.executemany("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        [(f"r{i}", "/x" * 50, "n", 0.0, "finished", 1, 1.0, 1.0, "m", "lora", "") for i in range(400)])
        con.commit()
        con.close()
        data = bytearray(db.read_bytes())
        data[4096:8192] = os.urandom(4096)
        db.write_bytes(bytes(data))
    return db


@pytest.mark.parametrize("how", ["garbage", "folder", "damaged_page"])
def test_runs_list_rebuilds_an_unreadable_index_and_says_so(how, studio_home, capsys):
    run_folder(studio_home / "runs", "stopped", name="kept-run")
    db = corrupt_index(studio_home, how)
    before = db.read_bytes() if db.is_file() else None
    assert main(["runs", "list", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert [r["run_id"] for r in json.loads(out)] == ["kept-run"]
    assert err.startswith("note: the run index ") and "rebuilt it from the run folders" in err
    aside = studio_home / "runs.sqlite.corrupt"
    assert aside.exists() and (before is None or aside.read_bytes() == before)  # nothing thrown away
    assert main(["runs", "list"]) == 0 and "note:" not in capsys.readouterr().err  # rebuilt once


def test_train_finishes_and_says_so_after_the_index_went_bad(studio_home, capsys, fake_worker):
    corrupt_index(studio_home, "garbage")
    assert main(["train", str(PRESET), "--set", "name=after-corruption"]) == 0
    text = output(capsys)
    assert "finished" in text and "rebuilt it from the run folders" in text
    assert main(["runs", "list", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["after-corruption"]


def test_a_run_whose_events_are_not_text_still_lists(studio_home, capsys):
    folder = Path(run_folder(studio_home / "runs", "stopped", name="torn"))
    with folder.joinpath("events.jsonl").open("ab") as handle:
        handle.write(bytes(range(128, 256)) + b"\n")  # a disk fault, or another program's bytes
    assert main(["runs", "list", "--json"]) == 0
    (row,) = json.loads(output(capsys))
    assert row["run_id"] == "torn" and row["status"] == "stopped" and row["steps"] == 2


@pytest.mark.skipif(ROOT_USER, reason="root reads folders whatever their permissions")
def test_an_unreadable_run_folder_is_skipped_and_said(studio_home, capsys):
    run_folder(studio_home / "runs", "stopped", name="fine")
    locked = Path(run_folder(studio_home / "runs", "stopped", name="locked"))
    locked.chmod(0)
    try:
        assert main(["runs", "list", "--json"]) == 0
    finally:
        locked.chmod(0o755)
    out, err = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(out)] == ["fine"] and "note: skipped" in err and "locked" in err


# --- resuming: a finished run is never trained again in place ------------------------------------

def test_more_steps_trains_a_finished_run_as_a_new_run(studio_home, capsys, fake_worker):
    source = Path(run_folder(studio_home / "runs"))
    before = {p: p.read_bytes() for p in source.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(source), "--more-steps", "3"]) == 0
    err = output(capsys)
    (call,) = fake_worker.calls
    new = call["folder"]
    assert new.path != source and new.path.parent == source.parent and call["resume"] is True
    assert call["config"].train.max_steps == 2 + 3  # from checkpoint-2
    assert new.latest_checkpoint().name == "checkpoint-2"
    assert f"run folder: {new.path}" in err and "for 3 more steps as a new run" in err
    assert {p: p.read_bytes() for p in source.rglob("*") if p.is_file()} == before


def test_resume_takes_a_run_id_from_runs_list(studio_home, capsys, fake_worker):
    source = Path(run_folder(studio_home / "runs", "stopped", name="20250101-000000-demo-abcd"))
    assert main(["train", "--resume", source.name]) == 0
    (call,) = fake_worker.calls
    assert call["folder"].path == source and call["resume"] is True
    assert f"run folder: {source}" in output(capsys)


def test_eval_passes_the_limit_it_was_given(tmp_path, capsys, fake_worker):
    fake_worker.terminal = {"type": "JobFailed", "message": "stopped by the test"}
    assert main(["eval", run_folder(tmp_path), "--limit", "3"]) == 1
    assert fake_worker.calls[0]["params"]["limit"] == 3
    capsys.readouterr()


# --- odd but usable ------------------------------------------------------------------------------

def test_a_config_saved_with_a_byte_order_mark_works(tmp_path, capsys):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + PRESET.read_bytes())
    assert main(["estimate", str(path), "--device", "cpu", "--worst-case", "--json"]) == 0
    assert json.loads(output(capsys).splitlines()[0])["total_bytes"] > 0


def test_a_long_unicode_run_name_makes_a_folder(studio_home, capsys, fake_worker):
    assert main(["train", str(PRESET), "--set", "name=" + "運転-ü" * 200]) == 0
    (call,) = fake_worker.calls
    assert len(call["folder"].path.name) < 80 and call["config"].name.startswith("運転-ü")
    assert RunConfig.load(call["folder"].config_path).name == call["config"].name
    output(capsys)


def test_the_finished_run_folder_fixture_is_finished(tmp_path):
    assert RunFolder(run_folder(tmp_path)).status() == "finished"
