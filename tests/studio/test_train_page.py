"""Train page against the fake worker: charts, memory telemetry, peaks, cancel and resume."""

from __future__ import annotations

from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command
from tests.fakes.fake_nvml import FakeSampler

WAIT_MS = 30_000


def test_a_run_fills_every_chart_and_compares_the_peaks(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=FakeSampler())
    page = studio.train_page
    studio.window.show_page("train")
    page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert studio.state.status == "finished"
    assert page.chart.point_count() == 10 and page.chart.eval_point_count() == 2
    for chart in (page.lr_chart, page.grad_chart, page.speed_chart):
        assert chart.point_count() == 10
    studio.monitor.sample_now()  # at least one NVML sample after the run started (the timer is 1 Hz)
    memory = page.gpu_panel.memory_chart
    assert memory.point_count("allocated") == 10 and memory.point_count("reserved") == 10
    assert memory.point_count("gpu_used") >= 1  # the monitor's NVML samples, on the same axis
    assert memory.marker_count("eval") == 2 and memory.marker_count("save") == 2
    assert memory.predicted_peak == studio.estimate.peak_bytes and memory.predicted_peak
    peaks = page.gpu_panel.peak_label.text()
    assert "Predicted peak" in peaks and "measured" in peaks and "peak allocated" in peaks
    assert studio.telemetry.measured_peak == max(
        e["memory"]["peak_bytes"] for e in RunFolder(studio.controller.folder.path).metrics())
    assert page.plan_label.text().startswith("Plan: fake: lora r=8")
    assert studio.monitor.worker_pid is None  # the monitor let go of the finished worker


def test_progress_shows_an_eta_and_the_monitor_follows_the_worker(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05), sampler=FakeSampler())
    page = studio.train_page
    page.start_button.click()
    qtbot.waitUntil(lambda: "left" in page.eta_label.text(), timeout=WAIT_MS)  # readouts refresh at 4 Hz
    assert studio.monitor.worker_pid == studio.client.pid()
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert studio.state.status == "cancelled"
    assert page.status_label.text().startswith("Cancelled")
    folder = RunFolder(studio.controller.folder.path)
    assert folder.status() == "cancelled" and folder.latest_checkpoint() is None
    assert page.eta_label.text() == ""


def test_stop_and_save_then_resume_from_the_checkpoint(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    window, page = studio.window, studio.train_page
    assert not page.resume_button.isEnabled()  # nothing to resume in a fresh home
    page.start_button.click()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 3, timeout=WAIT_MS)
    page.stop_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    folder = RunFolder(studio.controller.folder.path)
    checkpoint = folder.latest_checkpoint()
    assert studio.state.status == "stopped" and checkpoint is not None
    assert page.resume_button.isEnabled() and checkpoint.name in window.resume_action.toolTip()
    assert f"{studio.config.get('name')} · lora · 20" in window.resume_action.toolTip()  # named as on the Runs page
    stopped_at = studio.store.step
    page.resume_button.click()
    assert studio.client.is_running()
    qtbot.waitUntil(lambda: studio.store.step > stopped_at + 1, timeout=WAIT_MS)
    assert studio.controller.folder.path == folder.path  # the same run continues
    steps, _ = studio.store.series("loss")
    assert steps[0] == 1 and steps[stopped_at - 1] == stopped_at  # the history came back first
    assert f"resumed from {checkpoint}" in window.log_text()
    page.stop_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert folder.status() == "stopped"


def test_shortcuts_drive_the_run(qtbot, make_studio):
    studio = make_studio(fake_command("slow", delay=0.05))
    window = studio.window
    assert window.start_action.shortcut().toString() == "Ctrl+Return"
    assert window.stop_action.shortcut().toString() == "Ctrl+."
    window.start_action.trigger()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 2, timeout=WAIT_MS)
    assert not studio.train_page.start_button.isEnabled() and studio.train_page.stop_button.isEnabled()
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert studio.state.status == "stopped"


def test_before_any_run_the_bar_does_not_read_step_0_of_1(make_studio):
    page = make_studio().train_page
    assert page.progress.text() == "no run yet" and "step" not in page.progress.text()
    page.set_progress(0, 0, None, running=True)  # num_epochs: the worker has not counted the steps yet
    assert page.progress.text() == "counting the steps…"


def test_stop_is_off_once_the_run_ended_while_the_worker_is_still_exiting(qtbot, make_studio):
    studio = make_studio(fake_command("normal", None, "--linger", "3"))
    page = studio.train_page
    page.start_button.click()
    qtbot.waitUntil(lambda: studio.client.is_running() and page.stop_button.isEnabled(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: studio.state.status == "finished", timeout=WAIT_MS)
    assert studio.client.is_running()  # the worker lingers on: nothing left to stop
    assert not page.stop_button.isEnabled() and not studio.window.cancel_action.isEnabled()
    assert not page.start_button.isEnabled()  # Start waits for the worker to exit
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert not page.stop_button.isEnabled()


def test_another_preset_clears_the_last_runs_charts_plan_and_resume_target(qtbot, make_studio):
    from backend.core.paths import resources_dir

    studio = make_studio(fake_command("normal"))
    window, page = studio.window, studio.train_page
    page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    page.chart.flush()
    assert page.chart.point_count() == 10 and page.plan_label.text()
    assert window.resume_action.text().startswith("Train ") and window.resume_action.isEnabled()
    studio.pages["model"].use_preset(resources_dir() / "presets" / "tiny_dpo.yaml")
    page.chart.flush()
    assert page.chart.point_count() == 0 and not page.plan_label.isVisibleTo(page) and page.plan_label.text() == ""
    assert window.resume_action.text() == "Resume" and not window.resume_action.isEnabled()
    assert page.progress.text() == "no run yet" and studio.state.status == "idle"
    assert studio.controller.folder is None and "Finished" not in page.status_label.text()
