"""Train page after a failure: the out-of-memory fix in one click, Resume after a full disk, samples."""

from __future__ import annotations

from tests.fakes import fake_command

WAIT_MS = 30_000


def test_out_of_memory_offers_the_fix_and_a_fresh_start(qtbot, make_studio):
    studio = make_studio(fake_command("oom"))
    page, panel = studio.train_page, studio.train_page.failure_panel
    studio.window.show_page("train")
    assert panel.isHidden()
    page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert studio.state.status == "failed"
    assert panel.isVisible() and panel.title.text() == "Out of memory"
    text = panel.message.text()
    assert "backward" in text and "23.00 GiB" in text and "20.00 GiB" in text
    assert panel.fix_button.isVisible() and panel.fix_button.text().startswith("Apply fix: halve the micro batch")
    assert not panel.resume_button.isVisible() and not panel.restart_button.isVisible()
    techniques = studio.pages["techniques"]
    panel.fix_button.click()
    assert studio.config.get("train.micro_batch_size") == 1
    assert studio.config.get("train.gradient_accumulation_steps") == 8
    assert techniques.editor("train.gradient_accumulation_steps").value() == 8  # the form follows
    assert "train.gradient_accumulation_steps=8" in studio.config.command_line()
    assert panel.restart_button.isVisible() and not panel.fix_button.isEnabled()
    panel.restart_button.click()
    assert studio.client.is_running() and panel.isHidden()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)


def test_a_full_disk_offers_resume_from_the_checkpoint(qtbot, make_studio):
    studio = make_studio(fake_command("disk_full"))
    page, panel = studio.train_page, studio.train_page.failure_panel
    studio.window.show_page("train")
    page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert panel.isVisible() and panel.title.text() == "The disk is full"
    assert not panel.fix_button.isVisible()
    assert panel.resume_button.isVisible() and "checkpoint-5" in panel.resume_button.text()
    folder = studio.controller.folder
    panel.resume_button.click()
    assert studio.client.is_running() and studio.controller.folder.path == folder.path
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)


def test_a_crash_without_checkpoint_shows_no_resume(qtbot, make_studio):
    studio = make_studio(fake_command("crash"))
    panel = studio.train_page.failure_panel
    studio.window.show_page("train")
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert panel.isVisible() and panel.title.text() == "The worker crashed"
    assert not panel.resume_button.isVisible() and not panel.fix_button.isVisible()


def test_training_samples_are_listed(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    assert studio.train_page.samples.samples() == ["What is 10 + 10?  →  20", "What is 5 + 5?  →  10"]
