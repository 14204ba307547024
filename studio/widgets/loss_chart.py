"""LossChart: the live training loss curve with the evaluation loss as dots.

pyqtgraph rather than QtCharts: it redraws tens of thousands of points at ~10 Hz without stalling
the event loop, because clipToView draws only the visible range and auto-downsampling draws at
most about one point per pixel column (see LiveChart). The legend is a label under the plot
(chart_legend.with_legend): drawn in a corner, it covered the start of the curve.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from studio.state.metric_store import MetricStore
from studio.widgets.chart_legend import DASHED_DOTS, SOLID, entries_html, entry_html
from studio.widgets.live_chart import LiveChart, arrays

TRAIN_COLOR, EVAL_COLOR = "#3b82f6", "#f97316"


class LossChart(LiveChart):
    """Plots a MetricStore's `loss` (line) and `eval_loss` (dots) against the step."""

    def __init__(self, store: MetricStore | None = None, parent: QWidget | None = None) -> None:
        super().__init__(title="Loss", left="loss", parent=parent)
        self._loss = self.line(TRAIN_COLOR, name="train loss")
        self._eval = self.line(EVAL_COLOR, name="eval loss", style=Qt.PenStyle.DashLine, symbol="o", symbolSize=7,
                               symbolBrush=EVAL_COLOR, symbolPen=None)
        self.set_legend(entries_html([entry_html(TRAIN_COLOR, SOLID, "train loss"),
                                      entry_html(EVAL_COLOR, DASHED_DOTS, "eval loss")]))
        self._store: MetricStore | None = None
        if store is not None:
            self.set_store(store)

    def set_store(self, store: MetricStore) -> None:
        """Follow `store`: redraw whenever it changes."""
        if self._store is not None:
            self._store.changed.disconnect(self.mark_dirty)
        self._store = store
        store.changed.connect(self.mark_dirty)
        self.mark_dirty()
        self.flush()

    def point_count(self) -> int:
        """Training-loss points currently plotted (after any pending redraw)."""
        self.flush()
        x, _ = self._loss.getData()
        return 0 if x is None else len(x)

    def eval_point_count(self) -> int:
        self.flush()
        x, _ = self._eval.getData()
        return 0 if x is None else len(x)

    def redraw(self) -> None:
        if self._store is None:
            return
        data = []
        for curve, name in ((self._loss, "loss"), (self._eval, "eval_loss")):
            x, y = arrays(*self._store.arrays(name))
            curve.setData(x, y)
            data.append((x, y))
        self.fit_arrays(*data)
