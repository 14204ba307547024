"""Chat page against the fake worker: one session worker for message after message, streaming into one
or two panes, the conversation, Stop and New conversation keeping the session, Unload and a run change
ending it, a refused message, and the memory warning asked once per session."""

from __future__ import annotations

from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run

WAIT_MS = 30_000


def follow(page) -> dict[str, list]:
    """Worker pids (from WorkerReady), job starts and load phases seen by the page's JobController."""
    seen: dict[str, list] = {"pids": [], "starts": [], "loads": []}
    page.jobs.started.connect(lambda folder: seen["starts"].append(folder.path))

    def on_event(event) -> None:
        if event.type == "WorkerReady":
            seen["pids"].append(event.pid)
        elif event.type == "PhaseChanged" and event.phase == "load_model":
            seen["loads"].append(event.detail)

    page.jobs.event_received.connect(on_event)
    return seen


def ask(qtbot, page, text: str) -> None:
    page.message_edit.setText(text)
    page.send_button.click()
    assert page.answering and not page.send_button.isEnabled() and page.stop_button.isEnabled()
    qtbot.waitUntil(lambda: not page.answering, timeout=WAIT_MS)


def open_chat(make_studio, *args, runs: tuple[str, ...] = ("done",)):
    studio = make_studio(fake_command(*args))
    folders = [finished_run(studio, name) for name in runs]
    page = studio.pages["chat"]
    studio.window.show_page("chat")
    return studio, page, folders


def test_two_messages_are_answered_by_one_worker_that_loads_once(qtbot, make_studio):
    _, page, _ = open_chat(make_studio, "normal")
    seen = follow(page)
    assert page.picker.path() and page.send_button.isEnabled() and not page.unload_button.isEnabled()
    assert page.boxes["tuned"].isVisible() and not page.boxes["base"].isVisible()
    page.max_tokens.setValue(3)
    ask(qtbot, page, "hello")
    assert page.panes["tuned"].toPlainText() == "You: hello\n\nTuned: [tuned on 'hello'] tuned1 tuned2 "
    assert page.history == [{"role": "user", "content": "hello"},
                            {"role": "assistant", "content": "[tuned on 'hello'] tuned1 tuned2 "}]
    assert page.jobs.is_running() and page.session_live() and page.unload_button.isEnabled()
    assert page.status_label.text().startswith("Model loaded; answers come without reloading")
    page.message_edit.setText("again")
    page.message_edit.returnPressed.emit()
    qtbot.waitUntil(lambda: not page.answering, timeout=WAIT_MS)
    assert [m["role"] for m in page.history] == ["user", "assistant", "user", "assistant"]
    assert "You: again\n\nTuned: [tuned on 'again']" in page.panes["tuned"].toPlainText()
    assert len(seen["pids"]) == 1 and len(seen["starts"]) == 1 and seen["loads"] == ["tuned"]

    page.clear_button.click()  # New conversation: the history goes, the model stays
    assert page.history == [] and page.panes["tuned"].toPlainText() == "" and page.session_live()
    ask(qtbot, page, "fresh")
    assert page.history[0] == {"role": "user", "content": "fresh"} and len(page.history) == 2
    assert len(seen["pids"]) == 1 and seen["pids"][0] == page.jobs.client.pid()


def test_stop_keeps_the_session_and_unload_ends_it(qtbot, make_studio):
    _, page, _ = open_chat(make_studio, "normal", 0.05)
    seen = follow(page)
    page.set_model("both")
    assert page.boxes["tuned"].isVisible() and page.boxes["base"].isVisible()
    page.max_tokens.setValue(4)
    ask(qtbot, page, "hi")
    assert page.panes["base"].toPlainText().endswith("[base on 'hi'] base1 base2 base3 ")
    assert page.panes["tuned"].toPlainText().endswith("[tuned on 'hi'] tuned1 tuned2 tuned3 ")
    page.max_tokens.setValue(4000)
    page.message_edit.setText("long")
    page.send_button.click()
    qtbot.waitUntil(lambda: "base2" in page.panes["base"].toPlainText().split("long")[-1], timeout=WAIT_MS)
    page.stop_button.click()
    qtbot.waitUntil(lambda: not page.answering, timeout=WAIT_MS)
    assert page.status_label.text().startswith("Stopped: the answer so far is kept")
    assert "tuned1" not in page.panes["tuned"].toPlainText().split("long")[-1]  # cut before the tuned model
    assert page.session_live() and page.history[-1]["role"] == "assistant"
    page.max_tokens.setValue(2)
    ask(qtbot, page, "after the stop")  # the cut belonged to the answer before: this one is whole
    assert page.panes["tuned"].toPlainText().endswith("[tuned on 'after the stop'] tuned1 ")
    assert len(seen["pids"]) == 1

    page.unload_button.click()
    assert not page.send_button.isEnabled() and not page.unload_button.isEnabled()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.status_label.text().startswith("Model unloaded")
    assert page.jobs.outcome.status == "stopped" and page.send_button.isEnabled()
    assert len(page.history) == 6  # the conversation outlives the session
    ask(qtbot, page, "back")
    assert len(seen["pids"]) == 2 and seen["pids"][0] != seen["pids"][1]
    assert seen["loads"] == ["base and tuned", "base and tuned"]


def test_picking_another_run_ends_the_session(qtbot, make_studio):
    _, page, (older, newer) = open_chat(make_studio, "normal", runs=("older", "newer"))
    seen = follow(page)
    page.max_tokens.setValue(2)
    first = page.picker.path()
    ask(qtbot, page, "hello")
    assert page.session_live() and page.picker.isEnabled()
    other = next(str(f.path) for f in (older, newer) if str(f.path) != first)
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(other))
    assert page.history == [] and page.panes["tuned"].toPlainText() == ""
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert "change of run" in page.status_label.text()
    ask(qtbot, page, "hello")
    assert [str(p) for p in seen["starts"]] == [first, other] and len(set(seen["pids"])) == 2


def test_a_refused_message_keeps_the_session(qtbot, make_studio):
    _, page, _ = open_chat(make_studio, "normal")
    seen = follow(page)
    page.max_tokens.setValue(2)
    ask(qtbot, page, "hello")
    ask(qtbot, page, "refuse me")
    assert page.status_label.text().startswith("Message refused: the fake refuses this message")
    assert "color" in page.status_label.styleSheet()
    assert [m["content"] for m in page.history if m["role"] == "user"] == ["hello"]
    assert page.session_live() and page.send_button.isEnabled()
    ask(qtbot, page, "fine")
    assert len(page.history) == 4 and len(seen["pids"]) == 1


def test_the_memory_warning_is_asked_when_a_session_starts_not_per_message(qtbot, make_studio):
    studio, page, _ = open_chat(make_studio, "slow", 0.05)
    studio.window.start_action.trigger()
    assert studio.client.is_running()
    asked, answer = [], [False]
    page.confirm_memory = lambda warning: asked.append(warning) or answer[0]
    page.max_tokens.setValue(2)
    page.message_edit.setText("hi")
    page.send_button.click()
    assert len(asked) == 1 and "A fine-tune is running and is predicted to take" in asked[0]
    assert not page.jobs.is_running() and page.history == []
    answer[0] = True
    ask(qtbot, page, "hi")
    assert len(asked) == 2 and page.session_live()
    ask(qtbot, page, "and again")  # the model is loaded already: nothing new to warn about
    assert len(asked) == 2 and len(page.history) == 4
    studio.window.cancel_action.trigger()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=WAIT_MS)
    page.unload_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    ask(qtbot, page, "no run now")  # a new session, no fine-tune: no question
    assert len(asked) == 2
