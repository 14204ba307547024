"""Evaluate shows its progress: a busy bar while a model loads, a filling one while a measure counts (issue 33)."""

from __future__ import annotations

from tests.fakes import fake_command
from tests.studio.test_export_page import WAIT_MS, finished_run


def test_evaluate_shows_a_bar_that_follows_the_phases(qtbot, make_studio):
    studio = make_studio(fake_command("normal", 0.05))
    finished_run(studio)
    studio.window.show_page("export")
    evaluation = studio.pages["export"].evaluation
    assert not evaluation.progress.isVisibleTo(evaluation)
    seen = []
    evaluation.jobs.event_received.connect(lambda event: seen.append(
        (getattr(event, "detail", None), evaluation.progress.maximum(), evaluation.progress.value(),
         evaluation.progress.isVisibleTo(evaluation), evaluation.status_label.text())))
    evaluation.evaluate_button.click()
    qtbot.waitUntil(lambda: not evaluation.jobs.is_running(), timeout=WAIT_MS)
    states = {detail: rest for detail, *rest in seen}
    assert states["base"][0] == 0 and states["base"][2]  # loading: busy (no maximum), shown
    assert states["tuned 4/8 examples"][:3] == [8, 4, True]
    assert states["tuned 4/8 examples"][3] == "Perplexity: tuned 4/8 examples"
    assert not evaluation.progress.isVisibleTo(evaluation)  # gone once the job ended
