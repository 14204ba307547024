"""MultiSeriesChart: several live series of one store on one chart (chosen vs rejected, each reward function).

The series may be fixed names or found in the store as they appear (`names` a callable, e.g. every
rewards/<label>/mean of a GRPO run), each with its colour and a legend entry (rich text for a label under
the chart: studio/widgets/chart_legend.py).
"""

from __future__ import annotations

from typing import Any, Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from studio.widgets.chart_legend import DASHED, SOLID, entries_html, entry_html
from studio.widgets.live_chart import COLORS, LiveChart, arrays

SeriesNames = Callable[[], list[tuple[str, str]]]
"""() -> [(store name, legend label), ...]: the series to draw now."""


class MultiSeriesChart(LiveChart):
    """Plots `store.arrays(name)` for every (name, label) that `names()` gives, one colour each."""

    def __init__(self, store: Any, names: SeriesNames, title: str, left: str = "", bottom: str = "step",
                 dashed: Callable[[str], bool] | None = None, group: Callable[[str], str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(title=title, left=left, bottom=bottom, parent=parent)
        self._store, self._names = store, names
        self._dashed = dashed or (lambda _name: False)
        self._group = group or (lambda name: name)
        """Series of one group share a colour (a reward's mean and its spread)."""
        self._curves: dict[str, pg.PlotDataItem] = {}
        store.changed.connect(self.mark_dirty)
        self.mark_dirty()

    def series_names(self) -> list[str]:
        """The store names drawn now (after any pending redraw)."""
        self.flush()
        return list(self._curves)

    def point_count(self, name: str) -> int:
        self.flush()
        curve = self._curves.get(name)
        x = curve.getData()[0] if curve is not None else None
        return 0 if x is None else len(x)

    def _legend_html(self, entries: list[tuple[str, str, str]]) -> str:
        """One coloured entry per solid series; a dashed one (a spread) beside a solid one of its colour
        shares a single "┄ spread" entry, so the legend stays one or two short lines."""
        solid_groups = {self._group(name) for name, _, _ in entries if not self._dashed(name)}
        items, shared = [], False
        for name, label, color in entries:
            if self._dashed(name) and self._group(name) in solid_groups:
                shared = True
                continue
            items.append(entry_html(color, DASHED if self._dashed(name) else SOLID, label))
        if shared:
            items.append(f"{DASHED}&nbsp;spread")
        return entries_html(items)

    def redraw(self) -> None:
        wanted = self._names()
        names = [name for name, _ in wanted]
        for name in [n for n in self._curves if n not in names]:
            self.getPlotItem().removeItem(self._curves.pop(name))
        data, entries = [], []
        groups = list(dict.fromkeys(self._group(name) for name in names))
        for name, label in wanted:
            curve = self._curves.get(name)
            if curve is None:
                style = Qt.PenStyle.DashLine if self._dashed(name) else None
                color = COLORS[groups.index(self._group(name)) % len(COLORS)]
                curve = self._curves[name] = self.line(color, style=style)
            entries.append((name, label, curve.opts["pen"].color().name()))
            x, y = arrays(*self._store.arrays(name))
            curve.setData(x, y)
            data.append((x, y))
        self.set_legend(self._legend_html(entries) if len(entries) > 1 else "")  # one series: the title names it
        self.fit_arrays(*data)

