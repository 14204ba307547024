"""Chat page with images against the fake worker: a vision-language run's page attaches an image by the file
picker or by a drop on the message box, the message carries it (an `<image>` marker and its path), the
conversation shows its thumbnail, and a text model's run keeps attaching off."""

from __future__ import annotations

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent, QImage

from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command
from tests.studio.test_chat_page import WAIT_MS, ask, open_chat
from tests.studio.test_export_page import finished_run


def vlm_run(studio, folder) -> RunFolder:
    """A finished run of a tiny random Qwen2.5-VL (its config.json is what makes it a VLM run)."""
    config = studio.config.config().model_copy(update={"name": "vlm"})
    config = config.model_copy(update={"model": config.model.model_copy(update={"path": str(folder)})})
    run = RunFolder.create(config)
    run.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(run.path), "max_steps": 1})
    run.append_event({"type": "JobFinished", "v": 1, "run_dir": str(run.path), "steps": 1})
    return run


def png(path, colour: str) -> str:
    image = QImage(80, 60, QImage.Format.Format_RGB32)
    image.fill(colour)
    assert image.save(str(path))
    return str(path)


def drop(widget, paths: list[str]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(p) for p in paths])
    event = QDropEvent(QPointF(QPoint(5, 5)), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    widget.dropEvent(event)


def test_a_vlm_run_attaches_images_by_picker_and_drop_and_shows_them(qtbot, make_studio, tmp_path):
    from tests import vision_models

    studio, page, _ = open_chat(make_studio, "normal", runs=())
    run = vlm_run(studio, vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "vlm"))
    page.refresh_runs()
    page.picker.choose(str(run.path))
    assert page.attach.allowed and page.attach.button.isEnabled() and page.message_edit.accepts_images
    red, blue = png(tmp_path / "red.png", "red"), png(tmp_path / "blue.png", "blue")
    (tmp_path / "notes.txt").write_text("not an image")
    page.attach.pick_files = lambda: [red]
    page.attach.button.click()
    drop(page.message_edit, [blue, str(tmp_path / "notes.txt")])  # the text file is no image: left out
    assert page.attach.paths == [red, blue] and page.attach.chips.count() == 2
    page.max_tokens.setValue(2)
    ask(qtbot, page, "What colours?")
    assert page.attach.paths == [] and page.images == [red, blue]
    assert page.history[0] == {"role": "user", "content": "<image><image>What colours?"}
    text = page.panes["tuned"].toPlainText()
    assert text.startswith("You:\n\ufffc \ufffc \nWhat colours?") and "seeing 2 images" in text  # two thumbnails
    html = page.panes["tuned"].toHtml()
    assert html.count("<img") == 2
    ask(qtbot, page, "And now?")  # a later message carries the conversation's images again, no new one
    assert page.images == [red, blue] and "seeing 2 images" in page.panes["tuned"].toPlainText().split("And now?")[-1]
    page.clear_button.click()
    assert page.images == [] and page.history == []


def test_a_text_model_run_keeps_attaching_off(qtbot, make_studio, tmp_path):
    studio, page, _ = open_chat(make_studio, "normal")
    page.refresh_runs()
    assert not page.attach.allowed and not page.message_edit.accepts_images
    assert "reads no images" in page.attach.button.toolTip()
    drop(page.message_edit, [png(tmp_path / "red.png", "red")])
    assert page.attach.paths == []
    page.max_tokens.setValue(2)
    ask(qtbot, page, "hello")
    assert "seeing" not in page.panes["tuned"].toPlainText() and page.images == []
    qtbot.waitUntil(lambda: not page.answering, timeout=WAIT_MS)


def test_a_finished_run_helper_is_a_text_run(make_studio):
    from studio.pages.chat_page import reads_images

    studio = make_studio(fake_command("normal"))
    assert not reads_images(finished_run(studio, "text")) and not reads_images(None)
