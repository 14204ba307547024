"""TokenHistogramChart: how long the examples are, against the chosen seq_len.

Bars count examples per token-length bin; a red vertical line marks train.seq_len, and the bars
beyond it (the examples that will be truncated) are drawn in red, so the share lost reads at a
glance. For rows with images, an outline over the same bins counts the text tokens alone, so the
bars (text and image tokens) show how far the images move each row (the Data page says so below it).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from studio.widgets.live_chart import LiveChart

BINS = 40


def whole_step(span: float, ticks: int = 6) -> int:
    """A tick step of 1, 2 or 5 x 10^k for about `ticks` ticks over `span`: never under 1, so a tiny set
    shows no half example and no half token."""
    step = 1
    while span / step > ticks:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


class TokenHistogramChart(LiveChart):
    """set_lengths() once per dataset, set_seq_len() whenever the seq_len changes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(title="Tokens per example", left="examples", bottom="tokens", parent=parent, grid=True)
        self._lengths = np.zeros(0)
        self._text = np.zeros(0)
        self.seq_len = 0
        self._bars = pg.BarGraphItem(x0=[], x1=[], height=[], brush="#3b82f6", pen=None)
        self._over = pg.BarGraphItem(x0=[], x1=[], height=[], brush="#ef4444", pen=None)
        item = self.getPlotItem()
        item.addItem(self._bars)
        item.addItem(self._over)
        self._line = pg.InfiniteLine(angle=90, movable=False,
                                     pen=pg.mkPen("#dc2626", width=2, style=Qt.PenStyle.DashLine),
                                     label="seq_len {value:.0f}",
                                     labelOpts={"position": 0.9, "color": "#dc2626", "anchors": [(1, 0), (1, 0)]})
        item.addItem(self._line)
        self._far_label = pg.TextItem(color="#dc2626", anchor=(1, 0))
        item.addItem(self._far_label, ignoreBounds=True)
        # A curve item, not a PlotDataItem: the chart's clip-to-view and downsampling would break its steps.
        self._text_line = pg.PlotCurveItem(pen=pg.mkPen("#f59e0b", width=2))
        item.addItem(self._text_line)
        self.bar_count = 0
        """How many bins are drawn (tests read it)."""

    def set_lengths(self, lengths: list[int] | tuple[int, ...], text_only: list[int] | tuple[int, ...] = ()) -> None:
        """lengths: tokens per example; text_only: the same examples' text tokens, when images add to them."""
        self._lengths = np.asarray(lengths, dtype=float)
        text = np.asarray(text_only, dtype=float)
        self._text = text if len(text) == len(self._lengths) and not np.array_equal(text, self._lengths) else np.zeros(0)
        self.mark_dirty()

    @property
    def shows_text_outline(self) -> bool:
        """Whether the text-only outline is drawn (tests read it)."""
        return bool(len(self._text)) and self._text_line.isVisible()

    def set_seq_len(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.mark_dirty()

    def line_position(self) -> float:
        return float(self._line.value())

    def redraw(self) -> None:
        lengths = self._lengths
        self._line.setValue(self.seq_len)
        if not len(lengths):
            for bars in (self._bars, self._over):
                bars.setOpts(x0=[], x1=[], height=[])
            self.bar_count = 0
            self._far_label.setText("")
            self._text_line.setVisible(False)
            return
        longest = float(lengths.max())
        counts, edges = np.histogram(lengths, bins=BINS, range=(0, longest + 1))
        left, right = edges[:-1], edges[1:]
        over = right > self.seq_len
        gap = (right - left) * 0.08
        self._bars.setOpts(x0=left[~over] + gap[~over], x1=right[~over] - gap[~over], height=counts[~over])
        self._over.setOpts(x0=left[over] + gap[over], x1=right[over] - gap[over], height=counts[over])
        self.bar_count = int((counts > 0).sum())
        tallest = float(counts.max())
        if len(self._text):
            text_counts, _ = np.histogram(self._text, bins=edges)
            self._text_line.setData(edges, text_counts.astype(float), stepMode="center")
            self._text_line.setVisible(True)
            tallest = max(tallest, float(text_counts.max()))
        else:
            self._text_line.setVisible(False)
        # A seq_len far beyond every example would squeeze the bars into a sliver: then the line
        # stays off to the right and its label says so.
        far = self.seq_len > 2.5 * longest
        top = longest * 1.15 if far else max(longest, float(self.seq_len)) * 1.05
        self._far_label.setText(f"seq_len {self.seq_len} →" if far else "")
        self._far_label.setPos(top, tallest)
        item = self.getPlotItem()
        for axis, span in (("bottom", top), ("left", tallest * 1.12)):
            step = whole_step(span, 8 if axis == "bottom" else 6)
            item.getAxis(axis).setTickSpacing(step, step)
        # Both axes: the base chart's empty range (y 0 to 1) has auto-range off, so the counts set y too.
        self.getPlotItem().getViewBox().setRange(xRange=(0, top), yRange=(0, tallest * 1.12), padding=0.0)

    def tallest_bar(self) -> float:
        """The highest bin's count (0 when nothing is drawn): the y axis must reach it."""
        heights = [float(max(bars.opts["height"], default=0)) for bars in (self._bars, self._over)]
        return max(heights)
