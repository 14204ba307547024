"""RedrawScheduler: one redraw at a time, in turn, for every live chart of the window.

A chart redraw (new curve data, then its repaint) costs a few milliseconds. Redrawing all seven
live charts at once every 100 ms would block the event loop for tens of milliseconds at a time;
taking them in turn, one per short tick, keeps each block small (the loop stays responsive) while
every chart still refreshes several times a second. Charts that are not visible are skipped and
stay dirty until they are shown.
"""

from __future__ import annotations

from typing import Protocol

from PySide6.QtCore import QObject, QTimer

TICK_MS = 30
"""One chart redraws per tick: seven busy charts each refresh about every 0.2 s."""


class _Chart(Protocol):
    def isVisible(self) -> bool: ...  # noqa: N802, E704
    def flush(self) -> None: ...  # noqa: E704


class RedrawScheduler(QObject):
    """Round-robin queue of dirty charts; `instance()` is the application's one scheduler."""

    _instance: "RedrawScheduler | None" = None

    def __init__(self, parent: QObject | None = None, tick_ms: int = TICK_MS) -> None:
        super().__init__(parent)
        self._queue: list[_Chart] = []
        self._timer = QTimer(self)
        self._timer.setInterval(tick_ms)
        self._timer.timeout.connect(self._on_timer_timeout)

    @classmethod
    def instance(cls) -> "RedrawScheduler":
        if cls._instance is None:
            cls._instance = RedrawScheduler()
        return cls._instance

    def request(self, chart: _Chart) -> None:
        """Redraw `chart` at its turn (once, however often it is requested meanwhile)."""
        if chart not in self._queue:
            self._queue.append(chart)
        if not self._timer.isActive():
            self._timer.start()

    def forget(self, chart: _Chart) -> None:
        if chart in self._queue:
            self._queue.remove(chart)

    def pending(self) -> int:
        return len(self._queue)

    def _on_timer_timeout(self) -> None:
        for index, chart in enumerate(self._queue):
            try:
                visible = chart.isVisible()
            except RuntimeError:  # deleted with its window
                visible = False
                self._queue.pop(index)
                break
            if visible:
                self._queue.pop(index)
                chart.flush()
                break
        if not any(self._visible(c) for c in self._queue):
            self._timer.stop()  # the hidden ones wait for their showEvent

    @staticmethod
    def _visible(chart: _Chart) -> bool:
        try:
            return chart.isVisible()
        except RuntimeError:
            return False
