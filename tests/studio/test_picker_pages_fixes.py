"""The pickers' pages as a person found them (issue 33, item 6): the Runs page's long failures, its Resume and
Train more, the log's order on Cancel, the Export page's verdict, the Serve tab's log and its Stop warning."""

from __future__ import annotations

import os
import subprocess
import sys

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder, mark_checkpoint_complete
from tests.fakes import fake_command
from tests.studio.test_export_page import WAIT_MS, finished_run


def test_a_long_failure_is_elided_in_its_column_and_whole_in_the_tooltip(qtbot, make_studio):
    from studio.pages.runs_page import CLAMPED, COLUMNS

    message = "CUDA out of memory while the optimizer stepped; " * 12
    failed = RunFolder.create(RunConfig.from_dict({"name": "broken"}))
    failed.append_event({"type": "JobFailed", "kind": "out_of_memory", "message": message})
    studio = make_studio()
    studio.window.resize(1024, 700)
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    status = COLUMNS.index("Status")
    assert page.table.columnWidth(status) <= CLAMPED["Status"]
    assert page.table.item(0, status).toolTip() == message
    right = page.table.columnViewportPosition(COLUMNS.index("Memory"))
    assert 0 <= right < page.table.viewport().width()  # the last column is still on screen


def test_the_runs_page_resume_names_the_run_and_a_cancelled_train_more_stays_on_the_page(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    done = finished_run(studio, "tiny-lora")
    (done.checkpoints_dir / "checkpoint-10").mkdir(parents=True)
    mark_checkpoint_complete(done.checkpoints_dir / "checkpoint-10", 10)
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    page.select_runs([done.run_id])
    assert page.resume_button.text() == "Train tiny-lora more…" and done.run_id in page.resume_button.toolTip()
    studio.controller.ask_more_steps = lambda folder, default: None  # the person cancels the question
    page.resume_button.click()
    assert studio.window.current_page() == "runs" and not studio.jobs["train"].is_running()


def test_the_workers_stopping_line_is_logged_before_cancelled(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    studio.window.start_action.trigger()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 2, timeout=WAIT_MS)
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    log = studio.window.log_text()
    assert "stopping at step" in log and "Cancelled" in log
    assert log.index("stopping at step") < log.index("Cancelled")  # in the order they happened


def test_a_success_is_said_once_and_another_format_clears_the_last_verdict(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.set_format("adapter")
    page.export_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert "passed every check" in page.report.verdict.text() and page.status_label.text() == ""
    page.set_format("merged")
    assert "passed every check" not in page.report.verdict.text() and page.report.rows() == []
    assert page.status_label.text() == "" and page.progress.value() == 0


def test_the_serve_log_follows_new_lines_and_clears_for_another_run(qtbot):
    from studio.widgets.log_view_widget import LogViewWidget
    from studio.widgets.serve_widget import ServeWidget

    panel = ServeWidget()
    qtbot.addWidget(panel)
    panel.resize(400, 300)
    panel.show()
    panel.set_target("/runs/a")
    assert isinstance(panel.log, LogViewWidget)
    for n in range(120):
        panel._on_line(f"INFO: line {n}")  # noqa: SLF001 (the CLI's lines, as the process hands them over)
    bar = panel.log.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == bar.maximum()  # the newest line is in view
    panel._on_line("error: the port is taken")  # noqa: SLF001
    panel.set_target("/runs/b")  # another run picked: the last server's words are not about it
    assert panel.log.toPlainText() == "" and panel.status_label.text() == ""


def test_the_servers_resource_tracker_does_not_warn_of_leaked_semaphores_on_stop():
    """A process holding a named semaphore, ended by SIGTERM as Stop ends the server: in the server's
    environment its resource tracker cleans up without the "leaked semaphore objects" warning."""
    from backend.serving.engines import TRACKER_WARNING, _env

    env = _env({})
    assert TRACKER_WARNING in env["PYTHONWARNINGS"].split(",")
    script = ("import multiprocessing, os, signal\n"
              "lock = multiprocessing.get_context('spawn').Lock()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n")
    plain = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONWARNINGS": ""})
    served = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert "leaked semaphore" in plain.stderr  # the warning Stop showed
    assert "leaked semaphore" not in served.stderr
