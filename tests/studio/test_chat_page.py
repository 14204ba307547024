"""Chat page against the fake worker: streaming into one or two panes, the conversation, Stop, the memory warning."""

from __future__ import annotations

from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run

WAIT_MS = 30_000


def test_the_tuned_answer_streams_and_the_conversation_is_sent_again(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    page = studio.pages["chat"]
    studio.window.show_page("chat")
    assert page.picker.path() and page.send_button.isEnabled()
    assert page.boxes["tuned"].isVisible() and not page.boxes["base"].isVisible()
    page.max_tokens.setValue(3)
    page.message_edit.setText("hello")
    page.send_button.click()
    assert page.jobs.is_running() and not page.send_button.isEnabled()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.panes["tuned"].toPlainText() == "You: hello\n\nTuned: [tuned on 'hello'] tuned1 tuned2 "
    assert page.history == [{"role": "user", "content": "hello"},
                            {"role": "assistant", "content": "[tuned on 'hello'] tuned1 tuned2 "}]
    page.message_edit.setText("again")
    page.message_edit.returnPressed.emit()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert [m["role"] for m in page.history] == ["user", "assistant", "user", "assistant"]
    assert "You: again" in page.panes["tuned"].toPlainText()


def test_both_models_answer_side_by_side_and_stop_cuts_short(qtbot, make_studio):
    studio = make_studio(fake_command("normal", 0.05))
    finished_run(studio)
    page = studio.pages["chat"]
    studio.window.show_page("chat")
    page.set_model("both")
    assert page.boxes["tuned"].isVisible() and page.boxes["base"].isVisible()
    page.max_tokens.setValue(4)
    page.message_edit.setText("hi")
    page.send_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.panes["base"].toPlainText().endswith("[base on 'hi'] base1 base2 base3 ")
    assert page.panes["tuned"].toPlainText().endswith("[tuned on 'hi'] tuned1 tuned2 tuned3 ")
    page.max_tokens.setValue(4000)
    page.message_edit.setText("long")
    page.send_button.click()
    qtbot.waitUntil(lambda: "tuned1" in page.panes["base"].toPlainText().split("long")[-1]
                    or "base3" in page.panes["base"].toPlainText().split("long")[-1], timeout=WAIT_MS)
    page.stop_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.status_label.text().startswith("Stopped")


def test_chat_during_a_fine_tune_warns_about_memory(qtbot, make_studio):
    studio = make_studio(fake_command("slow", 0.05))
    finished_run(studio)
    page = studio.pages["chat"]
    studio.window.show_page("chat")
    studio.window.start_action.trigger()
    assert studio.client.is_running()
    asked = []
    page.confirm_memory = lambda warning: asked.append(warning) or False
    page.message_edit.setText("hi")
    page.send_button.click()
    assert len(asked) == 1 and "A fine-tune is running and is predicted to take" in asked[0]
    assert not page.jobs.is_running() and page.history == []
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    page.max_tokens.setValue(2)
    page.send_button.click()  # no run now: no question
    assert len(asked) == 1 and page.jobs.is_running()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
