"""The pages that act on a run (Export, Evaluate, Chat) keep the run the user picked there, by name."""

from __future__ import annotations

from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command
from tests.studio.test_export_page import WAIT_MS, finished_run


def failed_run(studio, name: str = "broken") -> RunFolder:
    config = studio.config.config().model_copy(update={"name": name})
    folder = RunFolder.create(config)
    folder.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(folder.path), "max_steps": 10})
    folder.append_event({"type": "JobFailed", "v": 1, "run_dir": str(folder.path), "kind": "crash",
                         "message": "the worker crashed"})
    return folder


def other_than(picker, path: str) -> str:
    return next(picker.combo.itemData(i) for i in range(picker.combo.count()) if picker.combo.itemData(i) != path)


def test_export_and_evaluate_keep_the_picked_run_across_pages(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    finished_run(studio, "alpha")
    finished_run(studio, "beta")
    broken = failed_run(studio)
    window, page = studio.window, studio.pages["export"]
    window.show_page("export")
    picked = other_than(page.picker, page.picker.path())  # not the one shown first: a choice of the user's
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(picked))
    page.evaluation.evaluate_button.click()
    qtbot.waitUntil(lambda: not page.evaluation.jobs.is_running(), timeout=WAIT_MS)
    results = page.evaluation.figures()
    assert results[0] != ("—", "—")
    window.show_page("runs")
    runs = studio.pages["runs"]
    runs.select_runs([broken.path.name])  # the Runs page's selection is a failed run
    assert [s.run_id for s in runs.selected()] == [broken.path.name]
    window.show_page("chat")
    window.show_page("export")
    assert page.picker.path() == picked
    assert page.evaluation.figures() == results  # the results of the run still shown are kept


def test_chat_keeps_its_own_run_and_both_pickers_name_runs_as_the_runs_page_does(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    finished_run(studio, "alpha")
    finished_run(studio, "beta")
    window, chat, export = studio.window, studio.pages["chat"], studio.pages["export"]
    window.show_page("chat")
    picked = other_than(chat.picker, chat.picker.path())
    chat.picker.combo.setCurrentIndex(chat.picker.combo.findData(picked))
    window.show_page("export")
    export_shows = export.picker.path()
    window.show_page("runs")
    studio.pages["runs"].select_runs([RunFolder(other_than(chat.picker, picked)).run_id])
    window.show_page("chat")
    assert chat.picker.path() == picked  # the Runs page's selection does not move a page's own choice
    window.show_page("export")
    assert export.picker.path() == export_shows
    summaries = {s.path: s for s in studio.pages["runs"].summaries}
    for picker in (chat.picker, export.picker):
        label = picker.combo.currentText()
        summary = summaries[picker.path()]
        assert label.startswith(f"{summary.name} · {summary.method} · {summary.steps} steps · finished · "), label
        assert RunFolder(picker.path()).run_id not in label and picker.path() in picker.combo.toolTip()


def test_the_runs_page_selection_seeds_a_picker_that_has_shown_no_run(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    first = finished_run(studio, "alpha")
    finished_run(studio, "beta")
    studio.window.show_page("runs")
    studio.pages["runs"].select_runs([first.path.name])
    studio.window.show_page("export")
    assert studio.pages["export"].picker.path() == str(first.path)


def test_a_picker_refresh_reads_only_the_runs_that_changed(qtbot, make_studio, monkeypatch):
    studio = make_studio(fake_command("normal"))
    first = finished_run(studio, "alpha")
    finished_run(studio, "beta")
    read = []
    real = RunFolder.summary
    monkeypatch.setattr(RunFolder, "summary", lambda self: read.append(self.run_id) or real(self))
    picker = studio.pages["export"].picker
    picker.refresh()
    picker.refresh()
    assert sorted(read) == sorted([first.run_id, RunFolder(other_than(picker, str(first.path))).run_id])
    first.append_event({"type": "JobStarted", "v": 1, "job": "export", "run_dir": str(first.path)})
    picker.refresh()
    assert read.count(first.run_id) == 2 and len(read) == 3
