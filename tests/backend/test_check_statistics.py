"""The export check's standard error (backend/export/check_statistics.py) against a direct computation, and the
probe a quantized format gets on the bundled tiny run's data (issue 34: SE under a fifth of the tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backend.export.check_statistics import SHARE, Increase, precision, relative_increase


def _rows(seed: int, sizes: list[int], row_spread: float, token_spread: float) -> list[np.ndarray]:
    """Per-token NLL differences, each row sharing an offset (the correlation within a row)."""
    rng = np.random.default_rng(seed)
    return [0.05 + rng.normal(0, row_spread) + rng.normal(0, token_spread, n) for n in sizes]


def test_standard_error_is_the_row_level_one_through_the_delta_method():
    sizes = [3, 7, 1, 12, 5, 5, 9, 2, 4, 6]
    rows = _rows(0, sizes, 0.2, 0.1)
    d = np.concatenate(rows)
    got = relative_increase(d.tolist(), sizes)
    # direct: the token-weighted mean, the row means weighted by their token counts, G/(G-1) correction
    m = d.mean()
    means, weights = np.array([r.mean() for r in rows]), np.array(sizes, float)
    variance = len(sizes) / (len(sizes) - 1) * np.sum((weights * (means - m)) ** 2) / weights.sum() ** 2
    assert got.relative == pytest.approx(math.exp(m) - 1, rel=1e-12)
    assert got.standard_error == pytest.approx(math.exp(m) * math.sqrt(variance), rel=1e-12)
    assert (got.tokens, got.rows) == (len(d), len(sizes))
    # rows of equal size: the plain standard error of the row means
    equal = _rows(1, [4] * 20, 0.2, 0.1)
    flat = np.concatenate(equal)
    same = relative_increase(flat.tolist(), [4] * 20)
    row_means = np.array([r.mean() for r in equal])
    assert same.standard_error == pytest.approx(
        math.exp(flat.mean()) * row_means.std(ddof=1) / math.sqrt(20), rel=1e-12)
    # correlated tokens: the per-token error understates it, the row-level one does not
    assert same.standard_error > math.exp(flat.mean()) * flat.std(ddof=1) / math.sqrt(len(flat)) * 1.5


def test_one_row_has_no_standard_error_and_mismatched_counts_are_refused():
    one = relative_increase([0.1, 0.2, 0.3], [3])
    assert one.standard_error is None and one.relative == pytest.approx(math.exp(0.2) - 1)
    assert "no standard error" in one.text() and precision(one, 0.25)["precise_enough"] is False
    with pytest.raises(ValueError):
        relative_increase([0.1, 0.2], [3])


def test_precision_says_when_the_error_is_too_wide_and_how_many_rows_would_do():
    tight = precision(Increase(0.123, 0.011, 2048, 64), 0.25)
    assert tight["precise_enough"] and tight["rows_needed"] is None
    assert tight["shown"] == "+12.3% ± 1.1% (2,048 tokens in 64 rows)"
    loose = precision(Increase(0.20, 0.10, 300, 6), 0.25)  # SE 10% against a 5% target: 4x the rows
    assert not loose["precise_enough"] and loose["rows_needed"] == 24
    assert "above a fifth of the tolerance (5.0%)" in loose["precision"] and "24 rows" in loose["precision"]
    assert 0.10 / math.sqrt(24 / 6) < 0.25 / SHARE + 1e-12


def test_a_quantized_format_gets_a_larger_probe_of_validation_then_training_rows(bundled_model):
    from transformers import AutoTokenizer

    from backend.core.config.run_config import RunConfig
    from backend.core.registries.export_formats import tolerance
    from backend.export.verify import QUANTIZED_BUDGET, TOKEN_BUDGET, build_probe
    from tests.conftest import PRESET

    tokenizer = AutoTokenizer.from_pretrained(bundled_model)
    config = RunConfig.load(PRESET, ["data.max_examples=40"])  # the calibrated tests' runs: 2 validation rows
    precise = build_probe(config, tokenizer, "cpu", tolerance("merged", "bf16")[0])
    quantized = build_probe(config, tokenizer, "cpu", tolerance("gptq-int4", "bf16")[0], calibrated=True)
    assert precise.budget == TOKEN_BUDGET["cpu"] and quantized.budget == QUANTIZED_BUDGET["cpu"]
    # a GGUF on the CPU keeps the short probe (its report says when that leaves the error wide); a GPU widens it
    assert build_probe(config, tokenizer, "cpu", tolerance("gguf-q4_0", "bf16")[0]).budget == TOKEN_BUDGET["cpu"]
    assert build_probe(config, tokenizer, "cuda:0", tolerance("gguf-q4_0", "bf16")[0]).budget == QUANTIZED_BUDGET["cuda"]
    assert len(quantized.rows) == 40 > len(precise.rows)  # every row the run has, within the budget
    assert quantized.source == "the run's validation split (all 2 rows), then its training data (all 38 rows)"
    assert quantized.tokens <= quantized.budget
    # the run's data gone: the bundled demo_eval set, its 100 rows as far as the quantized budget goes
    moved = RunConfig.load(PRESET, ["data.max_examples=40"])
    moved.data.path = "/nonexistent/data.jsonl"
    fallback = build_probe(moved, tokenizer, "cpu", tolerance("gptq-int4", "bf16")[0], calibrated=True)
    assert fallback.source.startswith("the bundled demo_eval set") and len(fallback.rows) > len(precise.rows)
