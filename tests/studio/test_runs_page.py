"""Runs page: the history from the run folders, overlaid curves, config diffs, open, delete, resume."""

from __future__ import annotations

import json

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder


def _run(name: str, rank: int, losses: list[float], checkpoint: bool = False) -> RunFolder:
    config = RunConfig.from_dict({"name": name, "technique": {"lora_rank": rank}})
    folder = RunFolder.create(config)
    for step, loss in enumerate(losses, start=1):
        folder.append_event({"type": "MetricsLogged", "step": step, "max_steps": len(losses), "loss": loss})
    folder.append_event({"type": "JobFinished", "run_dir": str(folder.path), "steps": len(losses),
                         "final_loss": losses[-1], "stopped": checkpoint})
    if checkpoint:
        path = folder.checkpoints_dir / f"checkpoint-{len(losses)}"
        path.mkdir(parents=True)
        (path / CHECKPOINT_MARKER).write_text(json.dumps({"step": len(losses)}))
    return folder


def test_runs_are_listed_compared_and_diffed(qtbot, make_studio):
    a = _run("alpha", 8, [3.0, 2.0, 1.5])
    b = _run("beta", 16, [3.0, 1.8, 1.2, 1.0])
    studio = make_studio()
    page = studio.pages["runs"]
    studio.window.show_page("runs")  # showing the page syncs the index with the folders
    assert page.count_label.text() == "2 run(s)"
    names = {page.table.item(r, 0).text(): page.table.item(r, 1).text() for r in range(page.table.rowCount())}
    assert names == {"alpha": "finished", "beta": "finished"}
    page.select_runs([a.run_id, b.run_id])
    assert page.overlay.curve_count() == 2
    diff = {page.diff_table.item(r, 0).text(): (page.diff_table.item(r, 1).text(), page.diff_table.item(r, 2).text())
            for r in range(page.diff_table.rowCount())}
    by_name = {s.run_id: s.name for s in page.selected()}
    first = by_name[page.selected()[0].run_id]
    expected = ("8", "16") if first == "alpha" else ("16", "8")
    assert diff["technique.lora_rank"] == expected and "name" in diff
    assert "train.max_steps" not in diff
    page.select_runs([a.run_id])
    assert page.overlay.curve_count() == 1 and page.diff_table.rowCount() == 0


def test_open_and_delete_with_confirmation(qtbot, make_studio):
    keep = _run("keep", 8, [1.0])
    doomed = _run("doomed", 8, [1.0])
    studio = make_studio()
    page = studio.pages["runs"]
    page.refresh()
    opened = []
    page.open_url = opened.append
    page.select_runs([doomed.run_id])
    page.open_button.click()
    assert opened and opened[0].toLocalFile() == str(doomed.path)
    asked = []
    page.confirm_delete = lambda runs: asked.append([r.name for r in runs]) or False
    page.delete_button.click()
    assert asked == [["doomed"]] and doomed.path.exists()  # declined: nothing deleted
    page.confirm_delete = lambda runs: True
    page.delete_button.click()
    assert not doomed.path.exists() and keep.path.exists()
    assert [s.name for s in page.summaries] == ["keep"]


def test_resume_from_the_runs_page(qtbot, make_studio):
    from tests.fakes import fake_command

    plain = _run("plain", 8, [2.0])
    resumable = _run("resumable", 8, [2.0, 1.0], checkpoint=True)
    studio = make_studio(fake_command("normal"))
    page = studio.pages["runs"]
    page.refresh()
    page.select_runs([plain.run_id])
    assert not page.resume_button.isEnabled()
    page.select_runs([resumable.run_id])
    assert page.resume_button.isEnabled() and page.resume_button.text() == "Resume resumable (step 2)"
    page.resume_button.click()
    assert studio.window.current_page() == "train"
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=30_000)
    assert studio.state.status == "finished"
    steps, _ = studio.store.series("loss")
    assert steps[:2] == [1, 2] and steps[-1] == 10  # old curve, then the resumed steps 3..10
    assert RunFolder(resumable.path).status() == "finished"


def test_a_failed_run_says_why_and_its_config_opens(qtbot, make_studio):
    failed = RunFolder.create(RunConfig.from_dict({"name": "broken"}))
    failed.append_event({"type": "JobFailed", "kind": "out_of_memory",
                         "message": "CUDA out of memory in the backward pass at step 3"})
    done = _run("done", 8, [2.0, 1.0])
    studio = make_studio()
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    rows = {page.table.item(r, 0).text(): page.table.item(r, 1) for r in range(page.table.rowCount())}
    assert rows["broken"].text().startswith("failed: CUDA out of memory")
    assert rows["broken"].toolTip() == "CUDA out of memory in the backward pass at step 3"
    assert rows["done"].text() == "finished"  # no reason for a run that did not fail
    opened = []
    page.open_url = opened.append
    page.select_runs([failed.run_id])
    page.config_button.click()
    assert opened and opened[0].toLocalFile() == str(failed.config_path)
    page.select_runs([done.run_id])
    assert page.resume_button.text() == "Resume" or not page.resume_button.isEnabled()


def test_an_older_runs_index_is_rebuilt_with_the_reasons(qtbot, studio_home):
    import sqlite3

    from backend.api.run_index import RunIndex

    studio_home.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(studio_home / "runs.sqlite")
    db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, path TEXT, name TEXT, created REAL, status TEXT,"
               " steps INTEGER, final_loss REAL, tokens_per_s REAL, model TEXT, method TEXT)")
    db.commit()
    db.close()
    failed = RunFolder.create(RunConfig.from_dict({"name": "broken"}))
    failed.append_event({"type": "JobFailed", "kind": "crashed", "message": "the worker stopped unexpectedly"})
    index = RunIndex()
    assert [s.reason for s in index.sync()] == ["the worker stopped unexpectedly"]
    index.close()


def test_open_folder_without_a_file_manager_shows_the_path_to_copy(qtbot, make_studio):
    from PySide6.QtCore import Qt

    folder = _run("lonely", 8, [1.0])
    studio = make_studio()
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    page.open_url = lambda url: False  # what QDesktopServices.openUrl says when nothing can open a folder
    page.select_runs([folder.run_id])
    page.open_button.click()
    assert page.status_label.isVisible()
    assert "No file manager could open" in page.status_label.text() and str(folder.path) in page.status_label.text()
    assert page.status_label.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse
    page.open_url = lambda url: True
    page.open_button.click()
    assert not page.status_label.isVisible()


def test_a_multiple_selection_survives_a_refresh(qtbot, make_studio):
    a, b = _run("alpha", 8, [1.0]), _run("beta", 8, [1.0])
    studio = make_studio()
    page = studio.pages["runs"]
    page.refresh()
    page.select_runs([a.run_id, b.run_id])
    page.refresh()  # as when the page is shown again
    assert {s.run_id for s in page.selected()} == {a.run_id, b.run_id}
    assert page.overlay.curve_count() == 2


def test_two_sft_runs_compare_every_metric_they_logged_by_name(qtbot, make_studio):
    folders = []
    for name in ("alpha", "beta"):
        folder = RunFolder.create(RunConfig.from_dict({"name": name}))
        folder.append_event({"type": "JobStarted", "job": "finetune", "run_dir": str(folder.path), "max_steps": 2})
        for step in (1, 2):
            folder.append_event({"type": "MetricsLogged", "step": step, "max_steps": 2, "loss": 2.0 / step,
                                 "learning_rate": 1e-3, "grad_norm": 0.5, "tokens_per_s": 900.0,
                                 "extra": {"clip_ratio/low_mean": 0.1}})
        folder.append_event({"type": "EvalFinished", "step": 2, "eval_loss": 1.1})
        folder.append_event({"type": "JobFinished", "run_dir": str(folder.path), "steps": 2, "final_loss": 1.0})
        folder.append_event({"type": "JobStarted", "job": "export", "run_dir": str(folder.path), "max_steps": 6})
        folder.append_event({"type": "MetricsLogged", "step": 3, "max_steps": 6})  # an export's progress
        folders.append(folder)
    studio = make_studio()
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    page.select_runs([f.run_id for f in folders])
    titles = [page.metric_combo.itemText(i) for i in range(page.metric_combo.count())]
    assert page.metric_combo.isEnabled()
    assert titles == ["Training loss", "Evaluation loss", "Learning rate", "Gradient norm", "Useful tokens/s",
                      "Clipped share (low mean)"]
    page.set_metric("eval_loss")
    assert page.overlay.curve_count() == 2
    page.set_metric("loss")
    assert page.run_metrics.series(str(folders[0].path), "loss") == ([1.0, 2.0], [2.0, 1.0])  # not the export's
