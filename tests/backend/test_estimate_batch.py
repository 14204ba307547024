"""The activations part grows linearly with the micro-batch: packed rows attend per example (the
worker's sdpa_packed), so the s x s terms are per example, not per packed row (issue 25)."""

from __future__ import annotations

import sys

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import estimate
from tests.backend.test_estimate_families import GPT2_XL
from tests.conftest import ROOT


def _acts(batch: int, device: str = "cpu", **technique) -> int:
    run = RunConfig.from_dict({"technique": {"method": "full", "precision": "bf16", "attention": "sdpa",
                                             "gradient_checkpointing": False, **technique},
                               "train": {"seq_len": 1024, "micro_batch_size": batch}})
    return estimate(GPT2_XL, run, device=device).activations


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gpt2_xl_activations_are_linear_in_the_micro_batch(device):
    a = {b: _acts(b, device) for b in (1, 2, 4, 8, 32)}
    per_row = a[2] - a[1]
    for b in (4, 8, 32):
        assert a[b] == a[1] + (b - 1) * per_row, b


def test_eager_attention_over_a_packed_row_is_still_quadratic():
    """Eager attention sees the whole packed row (a block-diagonal mask): that growth is real."""
    assert _acts(4, attention="eager") - _acts(2, attention="eager") > 2 * (_acts(2, attention="eager") - _acts(1, attention="eager"))


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import estimate_batch

    return estimate_batch


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_measured_activations_at_batch_1_2_4_8_match_and_stay_linear(family):
    import torch

    bench = _bench()
    torch.set_num_threads(1)
    measured = {b: bench.measured(family, b, 64) for b in (1, 2, 4, 8)}
    for b in (1, 2, 4, 8):
        predicted = bench.predicted(family, b, 64)
        assert abs(predicted - measured[b]) <= 0.02 * measured[b], (family, b, predicted, measured[b])
    step = measured[4] - measured[2]
    assert abs((measured[8] - measured[4]) - 2 * step) <= 0.02 * step
