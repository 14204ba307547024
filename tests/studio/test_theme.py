"""Both themes: an unticked check box has an edge a person can see, a ticked one shows its tick."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QApplication, QCheckBox

from studio.services.theme import Theme

CONTRAST = 60
"""Least lightness difference (0-255) between the box's edge and the window around it."""


@pytest.fixture
def app_look():
    """The application's palette and style sheet are put back after the test."""
    app = QApplication.instance()
    palette, sheet = app.palette(), app.styleSheet()
    yield app
    app.setStyleSheet(sheet)
    app.setPalette(palette)


def _indicator(qtbot, checked: bool) -> tuple[QImage, QColor]:
    box = QCheckBox()
    qtbot.addWidget(box)
    box.setChecked(checked)
    box.resize(box.sizeHint())
    box.show()
    image = box.grab().toImage()
    return image, box.palette().color(box.backgroundRole())


def _lightness(image: QImage) -> list[int]:
    return [QColor(image.pixel(x, y)).lightness() for y in range(image.height()) for x in range(image.width())]


@pytest.mark.parametrize("name", ["light", "dark"])
def test_an_unticked_box_has_a_visible_edge(qtbot, app_look, name):
    Theme(app_look).apply(name)
    image, window = _indicator(qtbot, checked=False)
    edge = max(abs(value - window.lightness()) for value in _lightness(image))
    assert edge >= CONTRAST, f"the {name} theme's unticked box differs from the window by {edge} only"


@pytest.mark.parametrize("name", ["light", "dark"])
def test_a_ticked_box_shows_a_white_tick_on_the_highlight(qtbot, app_look, name):
    Theme(app_look).apply(name)
    image, _ = _indicator(qtbot, checked=True)
    highlight = app_look.palette().highlight().color()
    pixels = [QColor(image.pixel(x, y)) for y in range(image.height()) for x in range(image.width())]
    assert any(p.lightness() > 230 and p.saturation() < 40 for p in pixels), "no tick drawn"
    assert any(abs(p.hue() - highlight.hue()) < 8 and p.saturation() > 150 for p in pixels), "not filled"
