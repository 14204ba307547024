"""Run pickers follow the newest run until one is picked, name runs fully, and Resume offers the interrupted run."""

from __future__ import annotations

import dataclasses
import time

from backend.core.runs.run_continuation import continue_run
from backend.core.runs.run_folder import RunFolder, RunSummary, mark_checkpoint_complete
from studio.widgets.run_picker_widget import mark_of, run_label, summary_of
from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run


def _delete(studio, folder: RunFolder) -> None:
    """Delete a run as the person does, on the Runs page."""
    runs = studio.pages["runs"]
    studio.window.show_page("runs")
    runs.confirm_delete = lambda chosen: True
    runs.select_runs([folder.run_id])
    runs.delete_selected()


def _follows_until_picked(studio, key: str) -> None:
    window, page = studio.window, studio.pages[key]
    oldest = finished_run(studio, "tiny-lora")
    window.show_page(key)  # opened once with one run
    assert page.picker.path() == str(oldest.path)
    finished_run(studio, "tiny-lora")
    newest = finished_run(studio, "tiny-lora")
    window.show_page("train")
    window.show_page(key)
    assert page.picker.path() == str(newest.path) and page.picker.combo.currentIndex() == 0  # it followed
    middle = page.picker.combo.itemData(1)
    page.picker.combo.setCurrentIndex(1)  # the person picks the middle one
    later = finished_run(studio, "tiny-lora")
    window.show_page("train")
    window.show_page(key)
    assert page.picker.path() == middle  # a pick stays, new runs or not
    assert page.picker.combo.itemData(0) == str(later.path)
    _delete(studio, RunFolder(middle))
    window.show_page(key)
    assert page.picker.path() == str(later.path)  # the picked run is gone: it follows the newest again
    newer = finished_run(studio, "tiny-lora")
    window.show_page("train")
    window.show_page(key)
    assert page.picker.path() == str(newer.path)
    labels = [page.picker.combo.itemText(i) for i in range(page.picker.combo.count())]
    assert len(set(labels)) == len(labels), labels  # same-named runs are told apart


def test_the_export_picker_follows_the_newest_run_until_one_is_picked(qtbot, make_studio):
    _follows_until_picked(make_studio(fake_command("normal")), "export")


def test_the_chat_picker_follows_the_newest_run_until_one_is_picked(qtbot, make_studio):
    _follows_until_picked(make_studio(fake_command("normal")), "chat")


def test_evaluate_prune_and_serve_act_on_the_run_the_export_picker_follows(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    page = studio.pages["export"]
    finished_run(studio, "first")
    studio.window.show_page("export")
    newest = finished_run(studio, "second")
    studio.window.show_page("train")
    studio.window.show_page("export")
    assert page.picker.path() == str(newest.path)
    assert page.evaluation._path == page.prune._path == page.serve._target == str(newest.path)  # noqa: SLF001


def test_a_page_in_view_follows_a_run_that_just_finished_training(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    page = studio.pages["export"]
    finished_run(studio, "first")
    studio.window.show_page("export")
    studio.window.start_action.trigger()  # a run trained while the Export page is in view
    qtbot.waitUntil(lambda: not studio.jobs["train"].is_running(), timeout=30_000)
    assert page.picker.path() == str(studio.controller.folder.path)


def test_a_label_says_name_method_steps_status_and_the_time_to_the_second():
    today = time.localtime()  # the label drops the date of a run made today: today's, whatever day the suite runs
    now = time.mktime((today.tm_year, today.tm_mon, today.tm_mday, 16, 42, 7, 0, 0, -1))
    summary = RunSummary("r", "/r", "tiny-lora", now, "finished", 60, 0.5, 100.0, "m", "lora")
    assert run_label(summary) == "tiny-lora · lora · 60 steps · finished · 16:42:07"
    assert run_label(dataclasses.replace(summary, created=now + 1)) != run_label(summary)  # one second apart
    interrupted = RunSummary("r", "/r", "tiny-lora", now, "incomplete", 7, None, None, "m", "lora")
    assert run_label(interrupted, "resumed") == "tiny-lora · lora · 7 steps · interrupted · 16:42:07 · resumed"
    yesterday = RunSummary("r", "/r", "old", now - 86_400, "finished", 1, None, None, "m", "lora")
    assert time.strftime("%Y-%m-%d 16:42:07", time.localtime(now - 86_400)) in run_label(yesterday)


def test_a_continued_and_a_resumed_run_are_marked(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    source = finished_run(studio, "tiny-lora")
    checkpoint = source.checkpoints_dir / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    mark_checkpoint_complete(checkpoint, 10)
    more = continue_run(source, 5)
    assert mark_of(more) == "continued from step 10" and mark_of(source) == ""
    source.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(source.path),
                         "max_steps": 10, "resumed_from": str(checkpoint)})
    source.append_event({"type": "JobFinished", "v": 1, "run_dir": str(source.path), "steps": 10})
    assert mark_of(source) == "resumed"
    assert run_label(summary_of(source), mark_of(source)).endswith(" · resumed")


def _interrupted(studio, name: str, status_event: dict | None) -> RunFolder:
    config = studio.config.config().model_copy(update={"name": name})
    folder = RunFolder.create(config)
    folder.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(folder.path), "max_steps": 10})
    if status_event is not None:
        folder.append_event({"run_dir": str(folder.path), "v": 1, **status_event})
    checkpoint = folder.checkpoints_dir / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    mark_checkpoint_complete(checkpoint, 4)
    return folder


def test_resume_after_a_restart_offers_the_interrupted_run_not_the_newest_finished(qtbot, make_studio):
    from backend.api.run_index import RunIndex
    from studio.run_controller import newest_resumable

    studio = make_studio(fake_command("normal"))
    interrupted = _interrupted(studio, "cut-short", None)  # the window closed mid-run: no last word
    _interrupted(studio, "thrown-away", {"type": "JobFailed", "kind": "cancelled", "message": "cancelled"})
    finished = finished_run(studio, "done")
    checkpoint = finished.checkpoints_dir / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    mark_checkpoint_complete(checkpoint, 10)
    assert newest_resumable(RunIndex()).path == interrupted.path
    restarted = make_studio(fake_command("normal"))
    action = restarted.window.resume_action
    assert action.isEnabled() and action.text() == "Resume cut-short (step 4)"  # the button names the run
    assert "interrupted" in action.toolTip() and interrupted.run_id in action.toolTip()


def test_a_stopped_or_crashed_run_is_offered_too_and_a_lone_finished_one_trains_more(qtbot, make_studio):
    from backend.api.run_index import RunIndex
    from studio.run_controller import newest_resumable

    studio = make_studio(fake_command("normal"))
    finished = finished_run(studio, "done")
    (finished.checkpoints_dir / "checkpoint-10").mkdir(parents=True)
    mark_checkpoint_complete(finished.checkpoints_dir / "checkpoint-10", 10)
    assert newest_resumable(RunIndex()).path == finished.path  # nothing interrupted: train the finished one more
    crashed = _interrupted(studio, "crashed", {"type": "JobFailed", "kind": "crashed", "message": "exit 9"})
    assert newest_resumable(RunIndex()).path == crashed.path
    crashed.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(crashed.path)})
    crashed.append_event({"type": "JobFinished", "v": 1, "run_dir": str(crashed.path), "stopped": True, "steps": 4})
    assert newest_resumable(RunIndex()).path == crashed.path  # stopped


def test_a_conversation_picks_its_run_so_a_new_run_does_not_end_it(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    chat = studio.pages["chat"]
    first = finished_run(studio, "talked-to")
    studio.window.show_page("chat")
    chat.message_edit.setText("Hello")
    chat.send()
    qtbot.waitUntil(lambda: not chat.answering, timeout=30_000)
    finished_run(studio, "newer")
    studio.window.show_page("train")
    studio.window.show_page("chat")
    assert chat.picker.path() == str(first.path) and chat.session_live()
