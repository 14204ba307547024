"""LossChart: the live training (and eval) loss curve.

pyqtgraph rather than QtCharts: it redraws tens of thousands of points at ~10 Hz without stalling
the event loop, because clipToView draws only the visible range and auto-downsampling draws at
most about one point per pixel column.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from studio.state.metric_store import MetricStore


class LossChart(pg.PlotWidget):
    """Plots a MetricStore's `loss` (line) and `eval_loss` (dots) against the step."""

    def __init__(self, store: MetricStore | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent=parent, background=None)
        item = self.getPlotItem()
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        item.showGrid(x=True, y=True, alpha=0.2)
        item.setLabel("bottom", "step")
        item.setLabel("left", "loss")
        item.addLegend(offset=(-10, 10))
        self._loss = item.plot(name="train loss", pen=pg.mkPen("#3b82f6", width=2))
        self._eval = item.plot(name="eval loss", pen=None, symbol="o", symbolSize=7,
                               symbolBrush="#f97316", symbolPen=None)
        self._store: MetricStore | None = None
        if store is not None:
            self.set_store(store)

    def set_store(self, store: MetricStore) -> None:
        """Follow `store`: redraw whenever it changes."""
        if self._store is not None:
            self._store.changed.disconnect(self._on_store_changed)
        self._store = store
        store.changed.connect(self._on_store_changed)
        self._on_store_changed()

    def point_count(self) -> int:
        """Training-loss points currently plotted (tests and the status line use it)."""
        x, _ = self._loss.getData()
        return 0 if x is None else len(x)

    def _on_store_changed(self) -> None:
        if self._store is None:
            return
        for curve, name in ((self._loss, "loss"), (self._eval, "eval_loss")):
            steps, values = self._store.series(name)
            curve.setData(np.asarray(steps, dtype=float), np.asarray(values, dtype=float))
