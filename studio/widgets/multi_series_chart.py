"""MultiSeriesChart: several live series of one store on one chart (chosen vs rejected, each reward function).

The series may be fixed names or found in the store as they appear (`names` a callable, e.g. every
rewards/<label>/mean of a GRPO run), each with its colour and a legend entry.
"""

from __future__ import annotations

from typing import Any, Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QWidget

from studio.widgets.live_chart import COLORS, LiveChart, arrays

LEGEND_SIZE = "7pt"
SeriesNames = Callable[[], list[tuple[str, str]]]
"""() -> [(store name, legend label), ...]: the series to draw now."""


class MultiSeriesChart(LiveChart):
    """Plots `store.arrays(name)` for every (name, label) that `names()` gives, one colour each."""

    def __init__(self, store: Any, names: SeriesNames, title: str, left: str = "", bottom: str = "step",
                 dashed: Callable[[str], bool] | None = None, group: Callable[[str], str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(title=title, left=left, bottom=bottom, parent=parent)
        self.getPlotItem().addLegend(offset=(-4, 2), labelTextSize=LEGEND_SIZE, verSpacing=-8, colCount=2)
        self._store, self._names = store, names
        self._dashed = dashed or (lambda _name: False)
        self._group = group or (lambda name: name)
        """Series of one group share a colour (a reward's mean and its spread)."""
        self._curves: dict[str, pg.PlotDataItem] = {}
        store.changed.connect(self.mark_dirty)
        self.mark_dirty()

    def _apply_palette(self) -> None:
        """As LiveChart's, and each legend label drawn again in the theme's text colour (small charts, small text)."""
        super()._apply_palette()
        legend = self.getPlotItem().legend
        if legend is None:
            return
        color = self.palette().color(QPalette.ColorRole.WindowText).name()
        for _sample, label in legend.items:
            label.setText(label.text, color=color, size=LEGEND_SIZE)

    def series_names(self) -> list[str]:
        """The store names drawn now (after any pending redraw)."""
        self.flush()
        return list(self._curves)

    def point_count(self, name: str) -> int:
        self.flush()
        curve = self._curves.get(name)
        x = curve.getData()[0] if curve is not None else None
        return 0 if x is None else len(x)

    def redraw(self) -> None:
        wanted = self._names()
        names = [name for name, _ in wanted]
        for name in [n for n in self._curves if n not in names]:
            self.getPlotItem().removeItem(self._curves.pop(name))
        data = []
        groups = list(dict.fromkeys(self._group(name) for name in names))
        for name, label in wanted:
            curve = self._curves.get(name)
            if curve is None:
                style = Qt.PenStyle.DashLine if self._dashed(name) else None
                color = COLORS[groups.index(self._group(name)) % len(COLORS)]
                curve = self._curves[name] = self.line(color, name=label, style=style)
                self._apply_palette()
            x, y = arrays(*self._store.arrays(name))
            curve.setData(x, y)
            data.append((x, y))
        legend = self.getPlotItem().legend
        if legend is not None:
            legend.setVisible(len(wanted) > 1)  # one series: the title names it
        self.fit_arrays(*data)
