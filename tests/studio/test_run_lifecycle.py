"""Resume and "train more" through the real window's controller, on the scripted worker."""

from __future__ import annotations

from backend.core.runs.run_continuation import ORIGIN
from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command

WAIT_MS = 30_000


def _start(qtbot, studio, name: str, scenario: str, stop_after: int | None = None) -> RunFolder:
    studio.controller.jobs.worker_command = fake_command(scenario, 0.05 if scenario == "slow" else None)
    studio.config.set("name", name)
    studio.window.start_action.trigger()
    if stop_after is not None:
        qtbot.waitUntil(lambda: studio.store.count("loss") >= stop_after, timeout=WAIT_MS)
        studio.window.stop_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    return RunFolder(studio.controller.folder.path)


def test_resume_continues_the_run_the_train_page_shows_not_the_selected_one(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    window, runs = studio.window, studio.pages["runs"]
    finished = _start(qtbot, studio, "run-b", "normal")
    assert finished.status() == "finished"
    window.show_page("runs")
    runs.select_runs([finished.run_id])  # a leftover selection on the Runs page must not steer Resume
    window.show_page("train")
    stopped = _start(qtbot, studio, "run-a", "slow", stop_after=3)
    assert stopped.status() == "stopped"
    step = int(stopped.latest_checkpoint().name.rsplit("-", 1)[1])
    assert window.resume_action.text() == f"Resume run-a (step {step})"  # named on the button itself
    record = finished.events_path.read_bytes()
    studio.train_page.resume_button.click()
    qtbot.waitUntil(lambda: studio.store.step > step + 1, timeout=WAIT_MS)
    assert studio.controller.folder.path == stopped.path
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    assert finished.events_path.read_bytes() == record  # the finished run was never touched


def test_a_finished_run_trains_more_steps_as_a_new_run_and_keeps_its_record(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    window, page = studio.window, studio.train_page
    finished = _start(qtbot, studio, "run-b", "normal")
    record, summary = finished.events_path.read_bytes(), finished.summary()
    assert window.resume_action.text() == "Train run-b more…" and page.resume_button.isEnabled()
    asked = []
    studio.controller.ask_more_steps = lambda folder, default: asked.append((folder.run_id, default)) or 5
    page.resume_button.click()
    assert asked == [(finished.run_id, 60)]  # the preset's max_steps is the suggestion
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    more = RunFolder(studio.controller.folder.path)
    assert more.path != finished.path and (more.path / ORIGIN).is_file()
    assert more.status() == "finished" and more.summary().steps == 15
    steps, _ = studio.store.series("loss")
    assert steps[0] == 1 and steps[-1] == 15  # the finished run's curve, then the new steps
    assert finished.events_path.read_bytes() == record and finished.summary() == summary
    assert window.resume_action.text() == "Train run-b-more more…"


def test_an_epoch_counted_run_trains_more_counted_in_steps(qtbot, make_studio):
    """num_epochs ruled the finished run: the suggestion is the steps it took, the new run counts steps."""
    studio = make_studio(fake_command("normal"))
    studio.config.set("train.num_epochs", 2)
    finished = _start(qtbot, studio, "epochs", "normal")
    assert finished.load_config().train.max_steps is None
    asked = []
    studio.controller.ask_more_steps = lambda folder, default: asked.append(default) or 5
    studio.train_page.resume_button.click()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    step = int(finished.latest_checkpoint().name.rsplit("-", 1)[1])
    train = RunFolder(studio.controller.folder.path).load_config().train
    assert asked == [step] and (train.max_steps, train.num_epochs) == (step + 5, None)


def test_a_new_run_clears_what_the_previous_one_showed(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    page = studio.train_page
    _start(qtbot, studio, "first", "normal")
    assert page.samples.count() > 0 and page.plan_label.text()
    for chart in page.charts():
        chart._manual = True  # noqa: SLF001 (as if the person had zoomed)
    studio.controller.jobs.worker_command = fake_command("slow", 0.2)
    studio.window.start_action.trigger()
    assert page.samples.count() == 0 and studio.store.count("loss") == 0
    assert not any(chart._manual for chart in page.charts())  # noqa: SLF001
    assert "measured: after a run" in page.gpu_panel.peak_label.text()
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)


def test_a_run_name_typed_then_started_with_the_shortcut_is_used(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    edit = studio.train_page.name_edit
    studio.window.show_page("train")
    studio.window.activateWindow()
    edit.setFocus()
    qtbot.waitUntil(edit.hasFocus, timeout=5_000)
    edit.setText("typed-name")  # typed, never committed with Enter or a focus change
    studio.window.start_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    assert RunFolder(studio.controller.folder.path).load_config().name == "typed-name"


def test_cancel_says_which_checkpoint_is_kept(qtbot, make_studio):
    studio = make_studio(fake_command("normal", 0.3))
    studio.window.start_action.trigger()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 6, timeout=WAIT_MS)  # checkpoint-5 is written
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    assert studio.state.status == "cancelled"
    assert "nothing saved since checkpoint-5, which is kept" in studio.train_page.status_label.text()


def test_a_multi_node_run_nobody_joins_says_whom_it_waited_for_and_gives_up(qtbot, make_studio):
    import sys

    studio = make_studio([sys.executable, "-c", "import time; time.sleep(120)"])  # a launcher waiting
    for key, value in (("hardware.strategy", "ddp"), ("hardware.num_machines", 2),
                       ("hardware.main_process_ip", "10.0.0.7"), ("hardware.rendezvous_timeout_s", 5)):
        studio.config.set(key, value)
    studio.estimate.recompute()
    studio.window.start_action.trigger()
    assert studio.jobs["train"].is_running(), studio.train_page.status_label.text()
    assert "Waiting for machine 2 of 2 to join at 10.0.0.7:29500" in studio.window.log_text()
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=WAIT_MS)
    text = studio.train_page.status_label.text()
    assert text == "Failed: machine 2 of 2 did not join at 10.0.0.7:29500 within 5 s (hardware.rendezvous_timeout_s)"
    folder = RunFolder(studio.controller.folder.path)
    assert folder.status() == "failed" and "did not join" in folder.summary().reason
