"""The calibration rows of a calibrated export: a bounded, evenly spaced pick of the run's training data.

The algorithms fit their scales to the activations these rows produce, so they come from the data
the model was tuned on (the bundled demo_eval set only when the run's data can no longer be read).
"""

from __future__ import annotations

import logging
from typing import Any

from backend.core.config.run_config import RunConfig

log = logging.getLogger(__name__)
MAX_TOKENS = 512
"""Tokens kept of each row (its start): longer rows add time, not different statistics."""


def calibration_rows(config: RunConfig, tokenizer: Any, samples: int) -> tuple[list[list[int]], str]:
    """(token id lists, where they came from in words): `samples` rows spread evenly over the training data."""
    from backend.training.tokenized import build_datasets

    try:
        train, _, _ = build_datasets(config, tokenizer)
        rows = [train[i]["input_ids"] for i in spread(len(train), samples)]
        source = "the run's training data"
    except Exception as exc:  # the data file moved or changed since the run
        log.warning("run data unusable for calibration (%s); using the bundled demo_eval set", exc)
        from backend.export.verify import perplexity_rows

        candidates, source = perplexity_rows(config, tokenizer)
        rows = [candidates[i]["input_ids"] for i in spread(len(candidates), samples)]
    rows = [list(r)[:MAX_TOKENS] for r in rows if len(r) > 1]
    return rows, f"{len(rows)} rows of {source} (at most {MAX_TOKENS} tokens each)"


def spread(total: int, wanted: int) -> list[int]:
    if total <= wanted:
        return list(range(total))
    return [round(i * (total - 1) / max(wanted - 1, 1)) for i in range(wanted)]

