"""Run folders are the truth; the SQLite index follows them, including hand-deleted folders."""

import json
import shutil

from backend.core.config.run_config import RunConfig
from backend.api.run_index import RunIndex
from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder


def finish(folder: RunFolder, loss: float, job: str = "finetune") -> None:
    folder.append_event({"type": "JobStarted", "v": 1, "job": job, "run_dir": str(folder.path)})
    folder.append_event({"type": "MetricsLogged", "v": 1, "step": 3, "max_steps": 3, "loss": loss})
    folder.append_event({"type": "JobFinished", "v": 1, "run_dir": str(folder.path), "final_loss": loss,
                         "tokens_per_s": 10.0 if job == "finetune" else None})


def test_index_follows_the_folders(studio_home):
    a = RunFolder.create(RunConfig(name="a"))
    b = RunFolder.create(RunConfig(name="b"))
    index = RunIndex()
    assert {s.status for s in index.sync()} == {"incomplete"}
    finish(a, 1.5)
    runs = {s.name: s for s in index.sync()}
    assert runs["a"].status == "finished" and runs["a"].final_loss == 1.5 and runs["a"].steps == 3
    finish(a, 9.9, job="export")  # an export afterwards does not change the run's figures
    runs = {s.name: s for s in index.sync()}
    assert runs["a"].final_loss == 1.5 and runs["a"].status == "finished" and runs["a"].tokens_per_s == 10.0
    shutil.rmtree(b.path)
    assert [s.name for s in index.sync()] == ["a"]
    index.close()


def test_torn_last_line_and_incomplete_checkpoints(studio_home):
    folder = RunFolder.create(RunConfig(name="torn"))
    finish(folder, 2.0)
    with folder.events_path.open("a") as handle:
        handle.write('{"type": "MetricsLogged", "step": 4')  # the worker died mid-write
    assert folder.status() == "finished"
    (folder.checkpoints_dir / "checkpoint-2").mkdir(parents=True)
    (folder.checkpoints_dir / "checkpoint-2" / CHECKPOINT_MARKER).write_text(json.dumps({"step": 2}))
    (folder.checkpoints_dir / "checkpoint-4").mkdir()
    assert folder.latest_checkpoint().name == "checkpoint-2"
    assert [p.name for p in folder.remove_incomplete_checkpoints()] == ["checkpoint-4"]


def test_the_method_column_names_an_objective_beyond_sft(studio_home):
    RunFolder.create(RunConfig(name="plain"))
    RunFolder.create(RunConfig.from_dict({"name": "pref", "technique": {"objective": "dpo", "method": "dora"}}))
    index = RunIndex()
    assert {s.name: s.method for s in index.sync()} == {"plain": "lora", "pref": "dora dpo"}
    index.close()


def test_a_new_session_reads_only_the_runs_that_changed(studio_home, monkeypatch):
    a = RunFolder.create(RunConfig(name="a"))
    b = RunFolder.create(RunConfig(name="b"))
    finish(a, 1.5)
    first = RunIndex()
    assert {s.name for s in first.sync()} == {"a", "b"}
    first.close()
    read = []
    real = RunFolder.summary
    monkeypatch.setattr(RunFolder, "summary", lambda self: read.append(self.run_id) or real(self))
    second = RunIndex()  # the next time the studio opens: the rows and their stamps are in the file
    assert {s.name: s.status for s in second.sync()} == {"a": "finished", "b": "incomplete"} and read == []
    finish(b, 0.7)
    assert {s.name: s.status for s in second.sync()} == {"a": "finished", "b": "finished"}
    assert read == [b.run_id]  # only the run whose events changed
    second.close()
    RunIndex().delete(a.run_id)
    third = RunIndex()
    assert [s.name for s in third.sync()] == ["b"] and read == [b.run_id]
    third.close()


def test_the_summary_status_matches_status_through_a_resume_and_an_export(studio_home):
    folder = RunFolder.create(RunConfig(name="r"))
    folder.append_event({"type": "JobStarted", "job": "finetune", "run_dir": str(folder.path)})
    folder.append_event({"type": "JobFailed", "kind": "crash", "message": "boom"})
    assert folder.summary().status == folder.status() == "failed" and folder.summary().reason == "boom"
    folder.append_event({"type": "JobStarted", "job": "finetune", "run_dir": str(folder.path)})  # a resume
    assert folder.summary().status == folder.status() == "incomplete" and folder.summary().reason == ""
    finish(folder, 1.0)
    finish(folder, 5.0, job="export")
    assert folder.summary().status == folder.status() == "finished"
