"""The window against the scripted fake worker: a run, garbage on stdout, a crash, a stop."""

from __future__ import annotations

from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command

WAIT_MS = 30_000  # generous: two shared cores, and each fake worker imports pydantic


def _run(qtbot, studio) -> None:
    studio.train_page.start_button.click()
    assert studio.client.is_running()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)


def test_normal_run_draws_loss_and_finishes(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    _run(qtbot, studio)
    window, page = studio.window, studio.train_page
    assert studio.state.status == "finished"
    assert page.chart.point_count() == 10
    assert page.tokens_label.text() == "1,234 useful tokens/s · MFU 41.2%"  # the finish's figures
    assert page.status_label.text().startswith("Finished")
    assert page.progress.value() == 10 and page.progress.maximum() == 10
    log = window.log_text()
    assert "Checkpoint saved at step 5" in log
    assert "fake worker: step 10" in log  # worker.log followed into the log pane
    assert RunFolder(studio.controller.folder.path).status() == "finished"
    assert page.start_button.isEnabled() and not page.stop_button.isEnabled()


def test_malformed_line_is_reported_and_the_run_finishes(qtbot, make_studio):
    studio = make_studio(fake_command("malformed"))
    _run(qtbot, studio)
    assert studio.state.status == "finished"
    log = studio.window.log_text()
    assert "Protocol error" in log and "this is not json" in log
    assert "NoSuchEvent" in log
    # the line written in two halves was still read as one event: 10 steps + the repeated step 4
    assert studio.store.count("loss") == 11


def test_crash_mid_run_is_reported_and_recorded(qtbot, make_studio):
    studio = make_studio(fake_command("crash"))
    reports: list[str] = []
    studio.client.worker_crashed.connect(reports.append)
    _run(qtbot, studio)
    assert studio.state.status == "failed"
    status = studio.train_page.status_label.text()
    assert "the worker stopped unexpectedly (exit code 9)" in status
    assert "crashing on purpose" in reports[0]  # the tail of worker.log is quoted
    assert "crashing on purpose" in studio.train_page.status_label.toolTip()
    log = studio.window.log_text()
    assert "Error: the worker stopped unexpectedly" in log
    assert "a traceback was written to worker.log" in log  # one pointer line instead of the traceback
    assert 'File "' not in log and "simulated CUDA error" not in log
    assert "fake worker: crashing on purpose" in log
    folder = RunFolder(studio.controller.folder.path)
    assert folder.status() == "failed"
    assert folder.terminal_event()["kind"] == "crashed"


def test_sigkill_names_the_signal(qtbot, make_studio):
    studio = make_studio(fake_command("sigkill"))
    _run(qtbot, studio)
    assert "killed by signal 9, SIGKILL" in studio.train_page.status_label.text()
    assert RunFolder(studio.controller.folder.path).status() == "failed"


def test_stop_button_stops_a_slow_run(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    finished = []
    studio.client.job_finished.connect(finished.append)
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 3, timeout=WAIT_MS)
    assert studio.train_page.stop_button.isEnabled()
    studio.train_page.stop_button.click()
    assert studio.state.status == "stopping"
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert finished and finished[0].stopped
    assert studio.state.status == "stopped"
    assert studio.train_page.status_label.text().startswith("Stopped at step")
    assert RunFolder(studio.controller.folder.path).status() == "stopped"


def test_closing_during_a_run_stops_saves_then_closes(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    studio.controller.ask_stop_on_close = lambda: "save"
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 2, timeout=WAIT_MS)
    assert studio.window.close() is False  # kept open while the worker saves
    assert studio.window.isVisible()
    qtbot.waitUntil(lambda: not studio.window.isVisible(), timeout=WAIT_MS)
    assert RunFolder(studio.controller.folder.path).status() == "stopped"


def test_closing_and_cancelling_keeps_the_run(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    studio.controller.ask_stop_on_close = lambda: "cancel"
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 1, timeout=WAIT_MS)
    assert studio.window.close() is False
    assert studio.client.is_running()
    studio.client.kill()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert RunFolder(studio.controller.folder.path).status() == "cancelled"


def test_a_missing_worker_program_is_a_clear_failure(qtbot, make_studio):
    studio = make_studio(["/nonexistent/python-for-the-worker"])
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert "could not start the worker" in studio.train_page.status_label.text()
    assert RunFolder(studio.controller.folder.path).status() == "failed"
    assert studio.train_page.start_button.isEnabled()


def test_an_invalid_form_never_starts_a_worker(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    studio.config.set("data.path", "")
    studio.config.set("train.max_steps", 5)
    studio.controller.config_factory = lambda: (_ for _ in ()).throw(ValueError("data.path is empty"))
    studio.train_page.start_button.click()
    assert not studio.client.is_running()
    assert "Cannot start: data.path is empty" in studio.train_page.status_label.text()


def test_throughput_readout_says_what_it_counts(make_studio):
    page = make_studio(fake_command("normal")).train_page
    assert page.tokens_label.text() == "— useful tokens/s"
    assert "padding and prompt tokens are not counted" in page.tokens_label.toolTip()
    assert "4 per frozen one" in page.tokens_label.toolTip()
    page.set_throughput(2048.4, 0.5, compile_seconds=31.25)
    assert page.tokens_label.text() == "2,048 useful tokens/s · MFU 50.0% · compile 31.2 s (not counted)"


def test_a_vision_language_run_shows_the_image_rows_and_tokens_it_trained_on(make_studio):
    from backend.core.protocol import MetricsLogged

    studio = make_studio(fake_command("normal"))
    state = studio.controller.state
    state.apply(MetricsLogged(step=1, max_steps=4, tokens_per_s=100.0, image_rows_seen=3, image_tokens_seen=1410))
    assert state.images_seen == (3, 1410)
    studio.train_page.set_throughput(state.tokens_per_s, None, None, state.images_seen)
    assert studio.train_page.tokens_label.text() == "100 useful tokens/s · 3 image rows, 1,410 image tokens"
    state.apply(MetricsLogged(step=2, max_steps=4, tokens_per_s=100.0))  # a text model's event leaves it as it was
    assert state.images_seen == (3, 1410)
