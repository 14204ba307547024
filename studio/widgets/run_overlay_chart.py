"""RunOverlayChart: the loss curves of several past runs on one chart, one colour each.

The legend (one entry per run) is a label under the plot (chart_legend.with_legend), so it never
covers a curve however many runs are picked.
"""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QWidget

from studio.widgets.chart_legend import SOLID, entries_html, entry_html
from studio.widgets.live_chart import COLORS, LiveChart, arrays


class RunOverlayChart(LiveChart):
    """`set_runs([(label, steps, values), ...])` replaces the curves (the loss, or a metric named by `title`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(title="Training loss of the selected runs", left="loss", parent=parent, grid=True)
        self._runs: list[tuple[str, list[float], list[float]]] = []
        self._curves: list[pg.PlotDataItem] = []

    def set_runs(self, runs: list[tuple[str, list[float], list[float]]],
                 title: str = "Training loss of the selected runs", left: str = "loss") -> None:
        self._runs = runs
        item = self.getPlotItem()
        if item.titleLabel.text != title:
            item.setTitle(title, size="9pt")
            item.setLabel("left", left)
            self.reset_range()
        self.mark_dirty()
        self.flush()

    def curve_count(self) -> int:
        self.flush()
        return len(self._curves)

    def redraw(self) -> None:
        item = self.getPlotItem()
        for curve in self._curves:
            item.removeItem(curve)
        self._curves = []
        data, entries = [], []
        for index, (label, steps, values) in enumerate(self._runs):
            color = COLORS[index % len(COLORS)]
            data.append(arrays(steps, values))
            self._curves.append(item.plot(*data[-1], name=label, pen=pg.mkPen(color, width=2)))
            entries.append(entry_html(color, SOLID, label))
        self.set_legend(entries_html(entries))
        self.fit_arrays(*data)
