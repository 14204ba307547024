"""MemoryChart: memory over time: NVML used vs torch reserved vs allocated, and the predicted peak.

One time axis (elapsed since the run started, h:mm:ss); the estimate's predicted peak is a dashed
horizontal line and every evaluation (orange) and checkpoint save (green) a vertical tick, so a
spike can be read against what caused it. Without NVML the worker's RSS (psutil) takes the place
of the GPU line. The axis is in GiB, or in MiB while everything drawn stays under 1 GiB; the legend
(drawn beside the chart, `legend_changed`) names only the series that are drawn.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QWidget

from studio.state.telemetry_store import TelemetryStore
from studio.widgets.live_chart import LiveChart, arrays
from studio.widgets.units import clock_text

GIB = float(1 << 30)
MIB = float(1 << 20)
MARKER_PENS = {"eval": "#f97316", "save": "#10b981"}
LINES = (
    ("gpu_used", "GPU used (NVML)", "#a855f7"),
    ("rss", "worker RSS", "#06b6d4"),
    ("reserved", "torch reserved", "#3b82f6"),
    ("allocated", "torch allocated", "#eab308"),
)


class ElapsedAxis(pg.AxisItem):
    """Seconds shown as m:ss or h:mm:ss."""

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        if spacing * scale >= 1:
            return [clock_text(v * scale) for v in values]
        return [f"{clock_text(v * scale)}.{int(round(v * scale * 10)) % 10}" for v in values]  # tenths


class MemoryChart(LiveChart):
    """Plots a TelemetryStore's memory series in GiB (or MiB) against elapsed time."""

    legend_changed = Signal(str)
    """The legend's rich text, whenever the set of drawn series changes."""

    def __init__(self, store: TelemetryStore, parent: QWidget | None = None) -> None:
        super().__init__(title="Memory over time", left="GiB", bottom="elapsed", parent=parent,
                         axis_items={"bottom": ElapsedAxis("bottom")})
        self._store = store
        item = self.getPlotItem()
        self._curves = {name: self.line(color) for name, _, color in LINES}
        self._peak_line = pg.InfiniteLine(angle=0, movable=False,
                                          pen=pg.mkPen("#ef4444", width=1.5, style=Qt.PenStyle.DashLine),
                                          label="predicted peak", labelOpts={"position": 0.1, "color": "#ef4444",
                                                                             "anchors": [(0, 1), (0, 1)]})
        self._peak_line.setVisible(False)
        item.addItem(self._peak_line, ignoreBounds=False)
        self._markers: dict[str, pg.PlotDataItem] = {
            kind: item.plot(pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DotLine), connect="pairs")
            for kind, color in MARKER_PENS.items()
        }
        for marker in self._markers.values():  # pairs of points: never thin them out or clip them
            marker.setDownsampling(ds=1, auto=False)
            marker.setClipToView(False)
        self.predicted_peak: int | None = None
        self.unit = "GiB"
        """The left axis's unit now: "GiB", or "MiB" while everything drawn is under 1 GiB."""
        self.drawn: tuple[str, ...] = ()
        """What the chart draws now: series names (LINES), "peak", "eval", "save"."""
        self._apply_palette()
        store.changed.connect(self.mark_dirty)
        self.mark_dirty()

    @staticmethod
    def legend_html(drawn: tuple[str, ...] | list[str]) -> str:
        """The colours of the `drawn` series as rich text that wraps between entries, never inside one."""
        entries = [(color, "■", label) for name, label, color in LINES if name in drawn]
        if "peak" in drawn:
            entries.append(("#ef4444", "┄", "predicted peak"))
        entries += [(MARKER_PENS[kind], "┆", label) for kind, label in (("eval", "eval"), ("save", "checkpoint"))
                    if kind in drawn]
        items = [f"<span style='color:{color}'>{mark}</span>&nbsp;{label.replace(' ', '&nbsp;')}"
                 for color, mark, label in entries]
        return "&nbsp;&nbsp; ".join(items)

    def set_predicted_peak(self, value: int | None) -> None:
        """The estimate's peak in bytes (None hides the line)."""
        self.predicted_peak = value
        self._peak_line.setVisible(bool(value))
        self.mark_dirty()

    def point_count(self, name: str) -> int:
        self.flush()
        x, _ = self._curves[name].getData()
        return 0 if x is None else len(x)

    def marker_count(self, kind: str) -> int:
        self.flush()
        x, _ = self._markers[kind].getData()
        return 0 if x is None else len(x) // 2

    def _set_unit(self, top_bytes: float) -> float:
        """Pick GiB or MiB for data reaching `top_bytes`; returns the unit's size in bytes."""
        unit = "GiB" if top_bytes >= GIB else "MiB"
        if unit != self.unit:
            self.unit = unit
            self.getPlotItem().setLabel("left", unit)
            self.reset_range()  # the sticky range was in the other unit
        return GIB if unit == "GiB" else MIB

    def redraw(self) -> None:
        series = {name: arrays(*self._store.arrays(name)) for name in self._curves}
        tops = [float(y.max()) for _, y in series.values() if len(y)] + [float(self.predicted_peak or 0)]
        size = self._set_unit(max(tops))
        drawn = [name for name, (x, _) in series.items() if len(x)]
        data = []
        top = 0.0
        for name, (x, y) in series.items():
            y = y / size
            self._curves[name].setData(x, y)
            data.append((x, y))
            if len(y):
                top = max(top, float(y.max()))
        if self.predicted_peak:
            self._peak_line.setValue(self.predicted_peak / size)
            top = max(top, self.predicted_peak / size)
            data.append((np.asarray([0.0]), np.asarray([self.predicted_peak / size])))
            drawn.append("peak")
        top = top * 1.05 or 1.0
        for kind, curve in self._markers.items():
            ts = [t for t, k, _ in self._store.markers if k == kind]
            xs = [t for t in ts for _ in (0, 1)]
            ys = [v for _ in ts for v in (0.0, top)]
            curve.setData(*arrays(xs, ys))
            if ts:
                drawn.append(kind)
        self.fit_arrays(*data, y_floor_zero=True)
        if tuple(drawn) != self.drawn:
            self.drawn = tuple(drawn)
            self.legend_changed.emit(self.legend_html(self.drawn))
