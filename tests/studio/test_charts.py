"""Charts: no zoom by accident, our own units on the axes, readable ticks from the first point, an honest legend."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from PySide6.QtCore import QObject, QPoint, QPointF, Qt, Signal
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication

from studio.state.telemetry_store import TelemetryStore
from studio.widgets.live_chart import MIN_SPAN_SHARE, sticky
from studio.widgets.memory_chart import MemoryChart
from studio.widgets.metric_chart import MetricChart
from tests.fakes.fake_nvml import FakeSampler

MIB = 1 << 20


class Series(QObject):
    """A store of one series, set by the test."""

    changed = Signal()

    def __init__(self, xs, ys) -> None:
        super().__init__()
        self.xs, self.ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)

    def arrays(self, _name: str):
        return self.xs, self.ys


class DoubleClick:
    """The part of pyqtgraph's MouseClickEvent a ViewBox reads: a left double click."""

    def double(self) -> bool:
        return True

    def button(self):
        return Qt.MouseButton.LeftButton

    def accept(self) -> None:
        pass


def _chart(qtbot, xs, ys) -> MetricChart:
    chart = MetricChart(Series(xs, ys), "value", "Value")
    qtbot.addWidget(chart)
    chart.resize(400, 300)
    chart.show()
    qtbot.waitExposed(chart)
    chart.flush()
    return chart


def _wheel(chart, modifiers=Qt.KeyboardModifier.NoModifier) -> bool:
    """Turn the wheel one notch over the middle of the plot; returns whether the chart took it."""
    view = chart.getPlotItem().getViewBox()
    centre = QPointF(chart.mapFromScene(view.sceneBoundingRect().center()))
    event = QWheelEvent(centre, QPointF(chart.viewport().mapToGlobal(centre.toPoint())), QPoint(), QPoint(0, 120),
                        Qt.MouseButton.NoButton, modifiers, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(chart.viewport(), event)
    return event.isAccepted()


def test_the_plain_wheel_leaves_the_chart_alone_and_ctrl_wheel_zooms_until_a_double_click(qtbot):
    chart = _chart(qtbot, range(1, 101), np.linspace(3.0, 1.0, 100))
    view = chart.getPlotItem().getViewBox()
    before = view.viewRange()
    _wheel(chart)
    assert view.viewRange() == before
    _wheel(chart, Qt.KeyboardModifier.ControlModifier)
    zoomed = view.viewRange()
    assert zoomed != before and zoomed[0][1] - zoomed[0][0] < before[0][1] - before[0][0]
    view.mouseClickEvent(DoubleClick())
    assert view.viewRange() == before


def test_the_plain_wheel_is_left_to_the_page_and_ctrl_wheel_is_the_charts(qtbot):
    """An ignored wheel event goes on to the parent widget: a scroll area around the page scrolls."""
    chart = _chart(qtbot, range(10), range(10))
    assert not _wheel(chart)
    assert _wheel(chart, Qt.KeyboardModifier.ControlModifier)


@pytest.mark.parametrize("value", [53.01, 0.0002, 5000.0, 0.0])
def test_one_point_or_a_flat_series_gets_distinct_readable_ticks(qtbot, value):
    low, high = sticky(None, value, value)
    assert high - low >= (abs(value) * MIN_SPAN_SHARE or 1.0)
    chart = _chart(qtbot, [1.0], [value])
    axis = chart.getPlotItem().getAxis("left")
    lo, hi = chart.getPlotItem().getViewBox().viewRange()[1]
    levels = axis.tickValues(lo, hi, axis.height() or 200)
    for spacing, values in levels:
        strings = axis.tickStrings(values, axis.autoSIPrefixScale * axis.scale, spacing)
        assert len(set(strings)) == len(strings), strings
        assert all(len(s.lstrip("-").replace(".", "").lstrip("0")) <= 4 for s in strings), strings  # digits


def test_axes_carry_our_unit_without_a_prefix_and_memory_picks_mib_or_gib(qtbot):
    store = TelemetryStore(clock=lambda: 0.0)
    chart = MemoryChart(store)
    qtbot.addWidget(chart)
    chart.resize(400, 300)
    chart.show()
    qtbot.waitExposed(chart)
    sampler = FakeSampler(nvml=False)
    for second in range(3):
        store.add_sample(replace(sampler(pid=1), time=float(second)))  # ~100 MiB of worker RSS, 1 s apart
    chart.flush()
    left = chart.getPlotItem().getAxis("left")
    assert chart.unit == "MiB" and left.labelString().count("MiB") == 1 and "(x" not in left.labelString()
    assert chart.point_count("rss") == 3
    chart.set_predicted_peak(3 << 30)
    chart.flush()
    assert chart.unit == "GiB" and "(x" not in left.labelString()
    assert chart.getPlotItem().getViewBox().viewRange()[1][1] >= 3.0  # the peak line, in GiB, is in view


def test_the_legend_names_only_what_is_drawn(qtbot):
    store = TelemetryStore()
    chart = MemoryChart(store)
    qtbot.addWidget(chart)
    legends = []
    chart.legend_changed.connect(legends.append)
    chart.show()
    store.add_sample(FakeSampler(nvml=False)(pid=1))  # no GPU: only the worker's RSS
    chart.flush()
    assert chart.drawn == ("rss",)
    assert "worker&nbsp;RSS" in legends[-1]
    for absent in ("GPU&nbsp;used", "torch", "predicted", "eval", "checkpoint"):
        assert absent not in legends[-1]
    chart.set_predicted_peak(200 * MIB)
    chart.flush()
    assert chart.drawn == ("rss", "peak") and "predicted&nbsp;peak" in legends[-1]
