"""The smallest supported window, 1024x700 with the log open, offscreen: pages scroll or reflow, never squeeze.

The screenshot test checks every page on a real X server; these run everywhere (no Xvfb needed)
on the two pages whose layout changes with the size.
"""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from tests.fakes.fake_nvml import FakeSampler
from tests.studio import layout_checks


def _show(qtbot, studio, key: str, size: tuple[int, int]):
    studio.window.resize(*size)
    studio.window.show_page(key)
    qtbot.waitExposed(studio.window)
    for _ in range(3):  # resizes, then the layouts they ask for, then a reflow's own
        QApplication.processEvents()
    return studio.pages[key]


def test_model_page_scrolls_instead_of_drawing_its_facts_over_each_other(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler())
    page = _show(qtbot, studio, "model", (1024, 700))
    form = page.facts["architecture"].parentWidget().layout()
    assert layout_checks.overlapping_rows(form) == []
    assert layout_checks.page_problems(page) == []


def test_techniques_form_is_one_column_when_narrow_and_two_when_wide(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler())
    page = _show(qtbot, studio, "techniques", (1024, 700))
    assert page.form.column_count == 1
    assert layout_checks.page_problems(page) == []  # no sideways scroll bar, no cut combo box
    page = _show(qtbot, studio, "techniques", (1600, 1000))
    assert page.form.column_count == 2
    assert layout_checks.page_problems(page) == []
    method, memory = page.editor("technique.method"), page.editor("technique.offload")
    assert method.mapTo(page, method.rect().topLeft()).x() < memory.mapTo(page, memory.rect().topLeft()).x()


def test_the_window_opens_inside_a_small_screens_available_area(qtbot):
    from PySide6.QtCore import QRect

    from studio.main_window import MainWindow, fitted_geometry

    small = QRect(0, 0, 1024, 700)
    fitted = fitted_geometry(QRect(0, 0, 1280, 800), small, frame_height=24)
    assert small.contains(fitted.adjusted(0, -24, 0, 0)) and fitted.width() == 1024 and fitted.height() == 676
    moved = fitted_geometry(QRect(900, 500, 800, 600), QRect(0, 0, 1600, 1000))  # a layout saved further right
    assert moved == QRect(800, 400, 800, 600)
    window = MainWindow()
    qtbot.addWidget(window)
    window.fit_to_screen()  # the offscreen screen is 800x800: smaller than the default 1280x800
    assert window.screen().availableGeometry().contains(window.geometry())


@pytest.mark.parametrize("size", [(1280, 800), (1278, 774)])  # 1278x774: what a 1280x800 screen gives it
def test_at_1280x800_the_kto_and_grpo_forms_fit_in_two_columns(qtbot, make_studio, size):
    from backend.core.paths import resources_dir

    studio = make_studio(sampler=FakeSampler())
    for preset in ("tiny_kto", "tiny_grpo"):
        studio.pages["model"].use_preset(resources_dir() / "presets" / f"{preset}.yaml")
        if preset == "tiny_grpo":  # two rewards: the page shows a line for each
            studio.config.set("grpo.rewards", [{"kind": "exact_match", "column": "answer", "weight": 1.0},
                                               {"kind": "regex", "pattern": "^(yes|no)$", "weight": 0.5}])
        qtbot.waitUntil(lambda: studio.estimate.seq_len_answer is not None, timeout=10000)  # its line's width
        page = _show(qtbot, studio, "techniques", size)
        scroll = page.form.parentWidget().parentWidget()
        assert page.form.column_count == 2, preset
        assert layout_checks.page_problems(page) == []
        assert scroll.verticalScrollBar().maximum() == 0, (preset, scroll.verticalScrollBar().maximum())


def test_the_estimates_notes_never_draw_over_its_parts_table_once_resized(qtbot, make_studio):
    from backend.core.paths import resources_dir

    studio = make_studio(sampler=FakeSampler())
    studio.pages["model"].use_preset(resources_dir() / "presets" / "tiny_kto.yaml")  # the longest notes
    _show(qtbot, studio, "techniques", (1600, 1000))
    for size in ((1024, 700), (1024, 600)):
        breakdown = _show(qtbot, studio, "techniques", size).breakdown
        assert breakdown.notes_label.text()
        assert not breakdown.notes_label.geometry().intersects(breakdown.table.geometry()), size
