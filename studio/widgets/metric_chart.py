"""MetricChart: one live series of a store (learning rate, grad norm, tokens/s, CPU %) as a line."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QWidget

from studio.widgets.live_chart import LiveChart, arrays


class MetricChart(LiveChart):
    """Plots `store.arrays(name)`; any store with `arrays()` and a `changed` signal will do."""

    def __init__(self, store: Any, name: str, title: str, color: str = "#10b981", left: str = "",
                 bottom: str = "step", parent: QWidget | None = None, axis_items: dict | None = None) -> None:
        super().__init__(title=title, left=left, bottom=bottom, parent=parent, axis_items=axis_items)
        self._store, self.name = store, name
        self._curve = self.line(color)
        store.changed.connect(self.mark_dirty)
        self.mark_dirty()

    def set_series(self, name: str, title: str) -> None:
        """Follow another series of the same store."""
        self.name = name
        self.reset_range()
        self.getPlotItem().setTitle(title, size="9pt")
        self._apply_palette()
        self.mark_dirty()

    def point_count(self) -> int:
        self.flush()
        x, _ = self._curve.getData()
        return 0 if x is None else len(x)

    def redraw(self) -> None:
        x, y = arrays(*self._store.arrays(self.name))
        self._curve.setData(x, y)
        self.fit_arrays((x, y), y_floor_zero=True)
