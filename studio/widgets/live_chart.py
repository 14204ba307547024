"""LiveChart: the base of every chart that follows a store while a run streams in.

The rules that keep the event loop free however fast events arrive and however long the run is:
- a store change only marks the chart dirty; the window's RedrawScheduler redraws dirty charts one
  at a time, in turn, so no single block of work is long;
- a chart that is not visible (another page is shown) does not redraw until it is shown;
- pyqtgraph draws only the visible range (clipToView) at about one point per pixel column
  (auto downsampling, "peak" mode so spikes survive);
- the axes are cached as pixmaps, and the view range grows in steps ("sticky" range) instead of
  following every new point, so the axes (text: the costly part of a repaint) are redrawn only when
  their range really changes. Zooming by hand pauses this; the "A" button or a double click resumes it.

Zooming and panning need Ctrl held (Ctrl+wheel, Ctrl+drag): a plain wheel scrolls the page the chart
is on, so a chart is never zoomed by accident. The axes show our units as they are (pyqtgraph's own
SI prefixes, "(x0.001)", are off), and a flat series or a single point gets a span its ticks can label.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QPalette, QPen, QShowEvent
from PySide6.QtWidgets import QGraphicsItem, QWidget

from studio.widgets.redraw_scheduler import RedrawScheduler

COLORS = ("#3b82f6", "#f97316", "#10b981", "#a855f7", "#ef4444", "#eab308", "#06b6d4", "#ec4899")
"""Series colours that read on both light and dark backgrounds."""
GROW = 0.25
"""When data leaves the sticky range, the range grows to fit it plus this share."""
MIN_SPAN_SHARE = 0.1
"""A flat series spans at least this share of its value (53.01 alone: 50.4 to 55.6, not 53.005 to 53.010)."""
X_MIN_SPAN = 5.0
"""The x axis (steps or seconds) spans at least this much, so a first point does not read 3.0, 3.1, 3.2."""
MIN_HEIGHT = 100
"""The smallest a chart is drawn: title, about forty pixels of plot, ticks and axis label."""
ZOOM_MODIFIER = Qt.KeyboardModifier.ControlModifier
"""Held to zoom (wheel) or pan (drag) a chart; without it the wheel scrolls the page."""


def arrays(xs, ys) -> tuple[np.ndarray, np.ndarray]:
    """Float copies of a series (a store's views change under pyqtgraph's feet otherwise)."""
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


def line_pen(color: str, style=None) -> QPen:
    """A one-pixel cosmetic pen: wider pens make Qt's raster engine several times slower."""
    pen = pg.mkPen(color, width=1)
    if style is not None:
        pen.setStyle(style)
    return pen


def sticky(current: tuple[float, float] | None, low: float, high: float, floor_zero: bool = False,
           min_span: float = 0.0) -> tuple[float, float]:
    """The range to show for data spanning [low, high]: `current` while it still fits the data well
    (contains it, and the data fills at least a third of it), else the data plus GROW of headroom.

    Data narrower than MIN_SPAN_SHARE of its size (or `min_span`) is centred in a range that wide."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return current or (0.0, 1.0)
    data_low = low
    floor = max(min_span, max(abs(low), abs(high)) * MIN_SPAN_SHARE) or 1.0
    if high - low < floor:
        middle = (low + high) / 2
        low, high = middle - floor / 2, middle + floor / 2
    span = high - low
    if current is not None:
        lo, hi = current
        if lo <= low and high <= hi and span >= (hi - lo) / 3:
            return current
    lo, hi = low - span * GROW * 0.2, high + span * GROW
    if floor_zero and data_low >= 0:
        lo = max(0.0, lo)
    return lo, hi


class ChartViewBox(pg.ViewBox):
    """A ViewBox that zooms and pans only with ZOOM_MODIFIER held, and asks for a reset on a double click."""

    sigResetRequested = Signal()
    """A double click: back to the automatic range."""

    def wheelEvent(self, ev, axis=None):  # noqa: N802 (pyqtgraph override)
        if ev.modifiers() & ZOOM_MODIFIER:
            super().wheelEvent(ev, axis)
        else:
            ev.ignore()  # on to the page: a scroll area scrolls

    def mouseDragEvent(self, ev, axis=None):  # noqa: N802 (pyqtgraph override)
        if ev.modifiers() & ZOOM_MODIFIER:
            super().mouseDragEvent(ev, axis)
        else:
            ev.ignore()

    def mouseClickEvent(self, ev):  # noqa: N802 (pyqtgraph override)
        if ev.double() and ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            self.sigResetRequested.emit()
            return
        super().mouseClickEvent(ev)


class LiveChart(pg.PlotWidget):
    """A PlotWidget with scheduled, visibility-aware redraws; subclasses implement `redraw()` and
    may call `fit(xs_min, xs_max, ys_min, ys_max)` to keep a sticky view range. Live charts have no
    grid (`grid=True` for charts drawn once, like the run overlay). A legend is rich text for a label
    under the plot (`set_legend`, chart_legend.with_legend), never drawn over the curves."""

    legend_changed = Signal(str)
    """The legend's rich text whenever it changes ("" when the title names the only series)."""

    def __init__(self, title: str = "", left: str = "", bottom: str = "step",
                 parent: QWidget | None = None, axis_items: dict | None = None, grid: bool = False) -> None:
        super().__init__(parent=parent, background=None, axisItems=axis_items, viewBox=ChartViewBox())
        self._dirty = False
        self._scheduler = RedrawScheduler.instance()
        self._x_range: tuple[float, float] | None = None
        self._y_range: tuple[float, float] | None = None
        self._manual = False
        self.legend = ""
        """The legend's rich text now."""
        item = self.getPlotItem()
        item.setClipToView(True)
        item.setDownsampling(auto=True, mode="peak")
        if grid:  # grid lines are drawn by the axes across the whole plot: they triple a repaint's cost
            item.showGrid(x=True, y=True, alpha=0.15)
        item.setMenuEnabled(False)
        for name in ("left", "bottom", "right", "top"):
            axis = item.getAxis(name)
            axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            axis.enableAutoSIPrefix(False)  # our label names the unit; no "(x0.001)" on top of it
        if title:
            item.setTitle(title, size="9pt")
        if left:
            item.setLabel("left", left)
        if bottom:
            item.setLabel("bottom", bottom)
        item.getViewBox().sigRangeChangedManually.connect(self._on_view_range_changed_manually)
        item.getViewBox().sigResetRequested.connect(self.reset_view)
        self.setMinimumHeight(MIN_HEIGHT)
        self._styled = True
        self._apply_palette()
        self._show_empty_range()

    # --- redraw scheduling --------------------------------------------------------------------
    def mark_dirty(self) -> None:
        """The data changed: redraw at this chart's next turn (or when shown)."""
        self._dirty = True
        self._scheduler.request(self)

    def flush(self) -> None:
        """Redraw now if anything changed (tests and `point_count`-style readers call it)."""
        if self._dirty:
            self._dirty = False
            self.redraw()

    def redraw(self) -> None:  # pragma: no cover (abstract)
        raise NotImplementedError

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        if self._dirty:
            self._scheduler.request(self)

    def set_legend(self, text: str) -> None:
        """Say the legend's rich text (once per change)."""
        if text != self.legend:
            self.legend = text
            self.legend_changed.emit(text)

    # --- sticky range -------------------------------------------------------------------------
    def line(self, color: str, name: str | None = None, style=None, **options) -> pg.PlotDataItem:
        """A live curve: one-pixel pen, at most about one bin per pixel column when downsampled."""
        curve = self.getPlotItem().plot(name=name, pen=line_pen(color, style), **options)
        curve.opts["autoDownsampleFactor"] = 1.0
        return curve

    def fit(self, x_low: float, x_high: float, y_low: float, y_high: float, y_floor_zero: bool = False) -> None:
        """Show [x_low, x_high] x [y_low, y_high], changing the view only when the data outgrew it."""
        view = self.getPlotItem().getViewBox()
        auto_x, auto_y = view.autoRangeEnabled()
        if auto_x or auto_y:  # the "A" button was pressed: back to automatic (sticky) ranging
            self._manual = False
            view.disableAutoRange()
            self._x_range = self._y_range = None
        if self._manual or not all(map(math.isfinite, (x_low, x_high, y_low, y_high))):
            return
        x_range = sticky(self._x_range, x_low, x_high, floor_zero=True, min_span=X_MIN_SPAN)
        y_range = sticky(self._y_range, y_low, y_high, floor_zero=y_floor_zero)
        if (x_range, y_range) != (self._x_range, self._y_range):
            self._x_range, self._y_range = x_range, y_range
            view.setRange(xRange=x_range, yRange=y_range, padding=0)

    def fit_arrays(self, *pairs: tuple[np.ndarray, np.ndarray], y_floor_zero: bool = False) -> None:
        """`fit` to the bounds of every non-empty (x, y) pair of arrays."""
        pairs = tuple((x, y) for x, y in pairs if len(x))
        if pairs:
            self.fit(min(float(x.min()) for x, _ in pairs), max(float(x.max()) for x, _ in pairs),
                     min(float(np.nanmin(y)) for _, y in pairs), max(float(np.nanmax(y)) for _, y in pairs),
                     y_floor_zero=y_floor_zero)

    def reset_range(self) -> None:
        """Forget the sticky range and any zoom (new data set: a cleared store, another run)."""
        self._x_range = self._y_range = None
        self._manual = False
        self._show_empty_range()

    def _show_empty_range(self) -> None:
        """Before any data: 0 to X_MIN_SPAN by 0 to 1, not pyqtgraph's 0-1 (ticks like 0:00.2) nor the last run's."""
        self.getPlotItem().getViewBox().setRange(xRange=(0.0, X_MIN_SPAN), yRange=(0.0, 1.0), padding=0)

    def reset_view(self) -> None:
        """Undo a zoom or pan: the automatic range again, at once."""
        self._manual = False
        self.reset_range()
        self.getPlotItem().getViewBox().enableAutoRange()
        self._dirty = True
        self.flush()

    def _on_view_range_changed_manually(self, *_args: object) -> None:
        self._manual = True

    # --- look ---------------------------------------------------------------------------------
    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        # A closed chart (pyqtgraph drops its plot item on close) may still hear the theme change.
        if event.type() == QEvent.Type.PaletteChange and getattr(self, "_styled", False) \
                and self.getPlotItem() is not None:
            self._apply_palette()

    def _apply_palette(self) -> None:
        text = self.palette().color(QPalette.ColorRole.WindowText)
        item = self.getPlotItem()
        for name in ("left", "bottom", "right"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(text.darker(130) if text.lightness() > 128 else text.lighter(160)))
            axis.setTextPen(pg.mkPen(text))
        item.titleLabel.setText(item.titleLabel.text, color=text.name())
