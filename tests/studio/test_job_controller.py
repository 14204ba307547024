"""JobController: one lifecycle per page; a page sees only the job it started; the quit dialog's words."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from studio.job_controller import JobController
from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run

WAIT_MS = 30_000


def test_each_job_ends_once_with_its_outcome_and_pages_see_only_their_own(qtbot, make_studio):
    studio = make_studio(fake_command("slow", 0.05))
    training, exporting = studio.jobs["train"], studio.jobs["export"]
    folder = finished_run(studio)
    ended: dict[str, list] = {"train": [], "export": []}
    training.ended.connect(ended["train"].append)
    exporting.ended.connect(ended["export"].append)
    studio.window.start_action.trigger()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 2, timeout=WAIT_MS)
    exporting.worker_command = fake_command("normal")
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(folder.path)))
    page.set_format("adapter")
    page.export_button.click()
    qtbot.waitUntil(lambda: not exporting.is_running(), timeout=WAIT_MS)
    assert [o.status for o in ended["export"]] == ["finished"] and ended["train"] == []
    assert training.is_running() and studio.state.running  # the export's end is not the run's
    assert "passed every check" in page.report.verdict.text()
    steps, _ = studio.store.series("loss")
    assert steps == sorted(steps)  # the export's progress never reached the training charts
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not training.is_running(), timeout=WAIT_MS)
    assert [o.status for o in ended["train"]] == ["cancelled"]
    assert training.outcome is ended["train"][0] and training.status == "cancelled"


def test_a_worker_that_cannot_start_ends_crashed_once(qtbot):
    jobs = JobController(worker_command=["/nonexistent/python", "-m", "backend.worker"])
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder

    folder = RunFolder.create(RunConfig(name="nostart"))
    ended = []
    jobs.ended.connect(ended.append)
    assert jobs.start(folder, RunConfig(name="nostart"), job="evaluate")
    qtbot.waitUntil(lambda: bool(ended), timeout=WAIT_MS)
    assert [o.status for o in ended] == ["crashed"] and "could not start the worker" in ended[0].message
    assert not jobs.is_running() and jobs.status == "crashed"


def test_the_quit_dialog_says_what_each_button_does(qtbot, make_studio):
    studio = make_studio(fake_command("slow", 0.05))
    seen = []

    def answer() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, answer)
            return
        seen.extend(button.text() for button in box.buttons())
        next(b for b in box.buttons() if b.text() == "Keep the window open").click()

    QTimer.singleShot(20, answer)
    assert studio.controller._ask_stop_on_close() == "cancel"  # noqa: SLF001 (the real dialog)
    assert sorted(seen) == ["Keep the window open", "Stop and save, then close", "Stop without saving, then close"]
