"""The perplexity check's standard error: how far the measured increase could be from the true one.

The check measures `exp(mean d) - 1`, d = the export's minus the trained model's negative log-likelihood of
every answer token. Tokens of one row share their context, so their d are correlated and a per-token
standard error would be too small: the rows are the independent draws, and the error is the cluster
(row-level) one, each row's mean d weighted by its token count, then carried through exp by the delta
method. A check is precise enough when that error is under a fifth of its tolerance (issue 34): then an
export within one standard error of the limit is the only one whose pass or fail is uncertain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

SHARE = 5
"""The standard error should be under tolerance / SHARE."""


@dataclass(frozen=True)
class Increase:
    """The relative perplexity increase and its row-level standard error (None with fewer than two rows)."""

    relative: float
    standard_error: float | None
    tokens: int
    rows: int

    def text(self) -> str:
        """As the report and the Export page show it, e.g. "+12.3% ± 1.1% (2,048 tokens in 64 rows)"."""
        spread = f" ± {self.standard_error:.1%}" if self.standard_error is not None else " (no standard error: one row)"
        return f"{self.relative:+.1%}{spread} ({self.tokens:,} tokens in {self.rows:,} rows)"


def relative_increase(diff: Sequence[float], row_tokens: Sequence[int]) -> Increase:
    """`diff`: the per-token differences, row after row; `row_tokens`: how many of them each row has.

    SE(m)^2 = G/(G-1) * sum_r (D_r - n_r m)^2 / N^2 (D_r: row r's sum of d, n_r its tokens, G rows, N
    tokens): the cluster-robust variance of a token-weighted mean; then SE(exp(m) - 1) = exp(m) SE(m).
    """
    values = [float(x) for x in diff]
    if sum(row_tokens) != len(values):
        raise ValueError(f"{len(values)} differences but rows of {sum(row_tokens)} tokens")
    sizes = [n for n in row_tokens if n > 0]
    total = len(values)
    mean = sum(values) / total if total else 0.0
    factor = math.exp(min(mean, 700.0))
    if len(sizes) < 2:
        return Increase(factor - 1.0, None, total, len(sizes))
    squares, start = 0.0, 0
    for n in sizes:
        squares += (sum(values[start:start + n]) - n * mean) ** 2
        start += n
    error = math.sqrt(len(sizes) / (len(sizes) - 1) * squares) / total
    return Increase(factor - 1.0, factor * error, total, len(sizes))


def precision(increase: Increase, tolerance: float) -> dict[str, object]:
    """Whether the standard error is under tolerance / SHARE and, when not, about how many rows would make it
    so (the error shrinks with the square root of the rows)."""
    target = tolerance / SHARE
    error = increase.standard_error
    enough = error is not None and error < target
    needed = None
    if error is not None and not enough:
        needed = math.ceil(increase.rows * (error / target) ** 2)
    if enough:
        note = f"standard error under a fifth of the tolerance ({target:.1%})"
    elif error is None:
        note = "one row scored: no standard error; the outcome is the tolerance's alone"
    else:
        note = (f"standard error above a fifth of the tolerance ({target:.1%}): about {needed:,} rows would bring it "
                f"under; near the limit the outcome is uncertain")
    return {"standard_error": error, "tokens": increase.tokens, "rows": increase.rows, "shown": increase.text(),
            "precise_enough": enough, "rows_needed": needed, "precision": note}
