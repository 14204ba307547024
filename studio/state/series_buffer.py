"""SeriesBuffer: one (x, y) series in preallocated numpy arrays, newest last, with a size limit.

Charts read the series many times a second while it grows by a hundred points a second; handing
them numpy arrays (no list, no per-point Python objects) keeps a redraw of 36,000 points cheap.
Storage is twice the capacity: appending writes at the end, and when the end is reached the newest
`capacity` points move to the front in one copy, so appending stays O(1) amortised, memory stays
bounded, and exactly the newest `capacity` points are kept.
"""

from __future__ import annotations

import numpy as np


class SeriesBuffer:
    """Append-only (x, y) float series holding the newest `capacity` points."""

    def __init__(self, capacity: int = 100_000, initial: int = 1024) -> None:
        self.capacity = capacity
        self._x = np.empty(min(initial, 2 * capacity))
        self._y = np.empty(min(initial, 2 * capacity))
        self._end = 0

    def __len__(self) -> int:
        return min(self._end, self.capacity)

    def append(self, x: float, y: float) -> None:
        if self._end == len(self._x):
            if self._end >= 2 * self.capacity:
                keep = self.capacity - 1  # the newest, moved to the front in one copy
                self._x[:keep] = self._x[self._end - keep:self._end]
                self._y[:keep] = self._y[self._end - keep:self._end]
                self._end = keep
            else:
                size = min(2 * self.capacity, len(self._x) * 2)
                self._x = np.resize(self._x, size)
                self._y = np.resize(self._y, size)
        self._x[self._end] = x
        self._y[self._end] = y
        self._end += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) views of the newest points, oldest first; valid until the next append."""
        start = max(0, self._end - self.capacity)
        return self._x[start:self._end], self._y[start:self._end]

    def lists(self) -> tuple[list[float], list[float]]:
        x, y = self.arrays()
        return x.tolist(), y.tolist()

    def latest(self) -> float | None:
        return float(self._y[self._end - 1]) if self._end else None

    def clear(self) -> None:
        self._end = 0
