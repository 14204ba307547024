"""A draft that cannot run says so beside the field it concerns, and Start touches nothing."""

from __future__ import annotations

from backend.core.paths import runs_dir
from tests.fakes import fake_command


def test_the_field_an_error_names_is_marked_and_start_makes_no_folder(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    editors = studio.editors
    assert editors.flagged == {}
    studio.config.set("hardware.num_processes", 2)  # strategy single runs one process
    flagged = editors.flagged
    assert set(flagged) == {"hardware.strategy", "hardware.num_processes"}, flagged
    widget = editors.first("hardware.num_processes")
    assert "#dc2626" in widget.styleSheet() and widget.toolTip().startswith("hardware.strategy single runs one")
    assert "Cannot start: hardware.strategy single" in studio.pages["techniques"].problem_label.text()
    studio.window.start_action.trigger()
    assert not studio.jobs["train"].is_running()
    assert not runs_dir().exists() or not any(runs_dir().iterdir())  # nothing made, nothing touched
    studio.config.set("hardware.strategy", "ddp")
    assert editors.flagged == {} and widget.styleSheet() == ""
    assert not widget.toolTip().startswith("hardware.strategy single")


def test_a_key_inside_a_longer_one_is_not_flagged():
    from studio.widgets.field_editors import _names

    assert _names("train.max_steps must be at least 1", "train.max_steps")
    assert not _names("train.max_steps_total is wrong", "train.max_steps")
    assert not _names("xtrain.max_steps is wrong", "train.max_steps")
