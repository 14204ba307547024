"""GPTQ against a transcription of its reference implementation, and the calibration's progress lines (a line
per decoder layer per pass, with the time left), on the bundled model and through the export job."""

from __future__ import annotations

import re

import pytest
import torch

from backend.export.calibrated import grid, gptq, layers
from backend.export.calibrated.collect import calibrate, passes
from tests.backend.test_export import _train, export
from tests.backend.test_export_calibrated import SHORT, _inputs

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("calibrated-progress"), "cal-progress", *SHORT)


def _reference_gptq(weight: torch.Tensor, x: torch.Tensor, args, group: int) -> torch.Tensor:
    """IST-DASLab/gptq's gptq.py (GPTQ.add_batch, then fasterquant with blocksize = groupsize, no act-order),
    transcribed; its Quantizer swapped for compressed-tensors' grid (grid.py), which the file stores."""
    columns = weight.shape[1]
    H, nsamples = torch.zeros(columns, columns), 0
    for inp in x.split(100):  # add_batch
        tmp = inp.shape[0]
        H *= nsamples / (nsamples + tmp)
        nsamples += tmp
        inp = (2 / nsamples) ** 0.5 * inp.float().t()
        H += inp.matmul(inp.t())
    W = weight.clone().float()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H[torch.arange(columns), torch.arange(columns)] += 0.01 * torch.mean(torch.diag(H))
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    low, high = grid.bounds(args)
    for i1 in range(0, columns, group):
        i2 = min(i1 + group, columns)
        W1, Err1, Hinv1 = W[:, i1:i2].clone(), torch.zeros(W.shape[0], i2 - i1), Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            w, d = W1[:, i], Hinv1[i, i]
            if (i1 + i) % group == 0:
                scale = grid.weight_qparams(W[:, i1 + i:i1 + i + group], args, torch.float32)[0].float()[:, 0]
            q = torch.clamp(torch.round(w / scale), low, high) * scale
            Q[:, i1 + i] = q
            err1 = (w - q) / d
            W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
            Err1[:, i] = err1
        W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
    return Q


def test_gptq_matches_a_transcription_of_the_reference_implementation():
    args = grid.scheme("gptq-int4", 32).weights
    torch.manual_seed(3)
    weight = torch.randn(40, 96) * 0.05
    x = _inputs(400, 96, outliers=4)
    x[:, 5] = 0.0  # a column no token reaches
    hessian = gptq.Hessian(96, x.device)
    for chunk in x.split(100):
        hessian.add(chunk)
    rounded, scale, _ = gptq.quantize(weight, *gptq.inverse_factor(hessian), args, torch.float32)
    expected = _reference_gptq(weight, x, args, 32)
    assert torch.allclose(rounded, expected, atol=1e-6), (rounded - expected).abs().max()


def test_calibration_tells_one_line_per_layer_in_order_with_the_time_left():
    from transformers import AutoModelForCausalLM

    from tests.conftest import BUNDLED_MODEL

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32).eval()
    linears = layers.quantized_linears(model)
    args, qparams = grid.scheme("gptq-int4", 32).weights, {}
    units = [gptq.GptqUnit(g, args, torch.float32, qparams) for g in gptq.shared_inputs(linears)]
    _, stack = layers.decoder_layers(model)
    per_layer = len(units) // len(stack)
    budget = sum(u.cost for u in units[:per_layer - 1]) + 65536  # short of a layer's statistics: two runs each
    lines: list[str] = []
    ran = calibrate(model, [[1, 5, 9, 14], [1, 7]], units, budget, name="gptq", tell=lines.append)
    assert ran == len(stack) * len(passes(units[:per_layer], budget)) > len(stack) and len(qparams) == len(linears)
    parsed = [re.fullmatch(rf"gptq: layer (\d+)/{len(stack)}, (\d+) s left", line) for line in lines]
    assert all(parsed), lines
    assert [int(m.group(1)) for m in parsed] == list(range(1, len(stack) + 1))
    assert int(parsed[-1].group(2)) == 0


def test_a_gptq_export_reports_its_layers_as_write_details(llama_run, tmp_path):
    events, report = export(llama_run, "gptq-int4", out=str(tmp_path / "told"), calibration_samples=4)
    details = [e["detail"] for e in events if e["type"] == "PhaseChanged" and e["detail"].startswith("gptq: layer")]
    assert details and all(re.fullmatch(r"gptq: layer \d+/\d+, \d+ s left", d) for d in details), details
    numbers = [int(re.search(r"layer (\d+)/", d).group(1)) for d in details]
    assert numbers == sorted(numbers) and numbers[-1] == int(re.search(r"/(\d+),", details[-1]).group(1))
    assert report["outcome"] == "passed"
