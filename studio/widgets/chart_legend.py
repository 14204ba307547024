"""A chart's legend as a small wrapping label under the plot, never drawn on it.

Drawn on the plot (pyqtgraph's LegendItem), a legend covered the curve it named: a loss that starts
high sat under the top-right corner. Under the plot it covers nothing and wraps between entries in a
narrow column. A chart says its legend's rich text through `legend_changed` (LiveChart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

if TYPE_CHECKING:
    from studio.widgets.live_chart import LiveChart

LEGEND_SIZE = "7pt"
SOLID, DASHED, DASHED_DOTS = "━━", "┄┄", "┄●┄"
"""The marks drawn before a label: a solid line, a dashed one, a dashed one with dots."""


def entry_html(color: str, mark: str, label: str) -> str:
    """One legend entry as rich text that never wraps inside itself."""
    return f"<span style='color:{color}'>{mark}</span>&nbsp;{label.replace(' ', '&nbsp;')}"


def entries_html(entries: list[str]) -> str:
    """Entries side by side, wrapping between them."""
    return "&nbsp;&nbsp; ".join(entries)


def with_legend(chart: LiveChart) -> QWidget:
    """The chart with its legend in a small wrapping label under it (hidden while there is none)."""
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(0)
    label = QLabel(chart.legend)
    label.setWordWrap(True)
    label.setStyleSheet(f"font-size: {LEGEND_SIZE};")
    label.setVisible(bool(chart.legend))
    label.setMinimumHeight(2 * label.fontMetrics().lineSpacing())  # room to wrap once: a grid cell does not ask
    chart.legend_changed.connect(label.setText)
    chart.legend_changed.connect(lambda text: label.setVisible(bool(text)))
    layout.addWidget(chart, 1)
    layout.addWidget(label)
    box.setToolTip(chart.toolTip())
    return box
