"""GPTQ against a transcription of its reference implementation (activation order, static groups), its fallback
to rounding to nearest, and the calibration's progress lines (a line per decoder layer, with the time left), on
the bundled model and through the export job."""

from __future__ import annotations

import copy
import math
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


# --- A transcription of IST-DASLab/gptq (https://github.com/IST-DASLab/gptq, Apache-2.0): quant.py's
# `quantize` and `Quantizer` at commit 2e22596c99dfcf415a3cb2535a674b76daa6e2c5 and gptq.py's `GPTQ` at commit
# 9f2abd32533c83079847435a7c971bb4420285c8, kept line for line where they run for an nn.Linear on a CPU; left out:
# the Conv2d and Conv1D branches, the trits and mse options, DEBUG, the timing and loss prints, the losses and
# torch.cuda.synchronize. A reference to compare with, never imported by the export.


def _ref_quantize(x, scale, zero, maxq):
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


class _RefQuantizer(torch.nn.Module):
    def __init__(self, shape=1):
        super().__init__()
        self.register_buffer("maxq", torch.tensor(0))
        self.register_buffer("scale", torch.zeros(shape))
        self.register_buffer("zero", torch.zeros(shape))

    def configure(self, bits, perchannel=False, sym=True):
        self.maxq = torch.tensor(2 ** bits - 1)
        self.perchannel = perchannel
        self.sym = sym

    def find_params(self, x, weight=False):
        dev = x.device
        self.maxq = self.maxq.to(dev)
        shape = x.shape
        if self.perchannel:
            if weight:
                x = x.flatten(1)
        else:
            x = x.flatten().unsqueeze(0)
        tmp = torch.zeros(x.shape[0], device=dev)
        xmin = torch.minimum(x.min(1)[0], tmp)
        xmax = torch.maximum(x.max(1)[0], tmp)
        if self.sym:
            xmax = torch.maximum(torch.abs(xmin), xmax)
            tmp = xmin < 0
            if torch.any(tmp):
                xmin[tmp] = -xmax[tmp]
        tmp = (xmin == 0) & (xmax == 0)
        xmin[tmp] = -1
        xmax[tmp] = +1
        self.scale = (xmax - xmin) / self.maxq
        if self.sym:
            self.zero = torch.full_like(self.scale, (self.maxq + 1) / 2)
        else:
            self.zero = torch.round(-xmin / self.scale)
        if not self.perchannel:
            tmp = shape[0] if weight else (shape[1] if len(shape) != 3 else shape[2])
            self.scale = self.scale.repeat(tmp)
            self.zero = self.zero.repeat(tmp)
        if weight:
            shape = [-1] + [1] * (len(shape) - 1)
            self.scale = self.scale.reshape(shape)
            self.zero = self.zero.reshape(shape)
            return

    def ready(self):
        return torch.all(self.scale != 0)


class _RefGPTQ:
    def __init__(self, layer):
        self.layer = layer
        self.dev = self.layer.weight.device
        W = layer.weight.data.clone()
        self.rows = W.shape[0]
        self.columns = W.shape[1]
        self.H = torch.zeros((self.columns, self.columns), device=self.dev)
        self.nsamples = 0

    def add_batch(self, inp, out):
        if len(inp.shape) == 2:
            inp = inp.unsqueeze(0)
        tmp = inp.shape[0]
        if len(inp.shape) == 3:
            inp = inp.reshape((-1, inp.shape[-1]))
        inp = inp.t()
        self.H *= self.nsamples / (self.nsamples + tmp)
        self.nsamples += tmp
        inp = math.sqrt(2 / self.nsamples) * inp.float()
        self.H += inp.matmul(inp.t())

    def fasterquant(self, blocksize=128, percdamp=.01, groupsize=-1, actorder=False, static_groups=False):
        W = self.layer.weight.data.clone()
        W = W.float()
        if not self.quantizer.ready():
            self.quantizer.find_params(W, weight=True)
        H = self.H
        del self.H
        dead = torch.diag(H) == 0
        H[dead, dead] = 1
        W[:, dead] = 0
        if static_groups:
            groups = []
            for i in range(0, self.columns, groupsize):
                quantizer = copy.deepcopy(self.quantizer)
                quantizer.find_params(W[:, i:(i + groupsize)], weight=True)
                groups.append(quantizer)
        if actorder:
            perm = torch.argsort(torch.diag(H), descending=True)
            W = W[:, perm]
            H = H[perm][:, perm]
            invperm = torch.argsort(perm)
        Q = torch.zeros_like(W)
        damp = percdamp * torch.mean(torch.diag(H))
        diag = torch.arange(self.columns, device=self.dev)
        H[diag, diag] += damp
        H = torch.linalg.cholesky(H)
        H = torch.cholesky_inverse(H)
        H = torch.linalg.cholesky(H, upper=True)
        Hinv = H
        for i1 in range(0, self.columns, blocksize):
            i2 = min(i1 + blocksize, self.columns)
            count = i2 - i1
            W1 = W[:, i1:i2].clone()
            Q1 = torch.zeros_like(W1)
            Err1 = torch.zeros_like(W1)
            Hinv1 = Hinv[i1:i2, i1:i2]
            for i in range(count):
                w = W1[:, i]
                d = Hinv1[i, i]
                if groupsize != -1:
                    if not static_groups:
                        if (i1 + i) % groupsize == 0:
                            self.quantizer.find_params(W[:, (i1 + i):(i1 + i + groupsize)], weight=True)
                    else:
                        idx = i1 + i
                        if actorder:
                            idx = perm[idx]
                        self.quantizer = groups[idx // groupsize]
                q = _ref_quantize(w.unsqueeze(1), self.quantizer.scale, self.quantizer.zero, self.quantizer.maxq
                                  ).flatten()
                Q1[:, i] = q
                err1 = (w - q) / d
                W1[:, i:] -= err1.unsqueeze(1).matmul(Hinv1[i, i:].unsqueeze(0))
                Err1[:, i] = err1
            Q[:, i1:i2] = Q1
            W[:, i2:] -= Err1.matmul(Hinv[i1:i2, i2:])
        if actorder:
            Q = Q[:, invperm]
        self.layer.weight.data = Q.reshape(self.layer.weight.shape).to(self.layer.weight.data.dtype)

# --- end of the transcription


def _reference(weight: torch.Tensor, x: torch.Tensor, bits: int, group: int | None, act_order: bool) -> torch.Tensor:
    """IST-DASLab's llama.py use of it (sym, per channel), static groups; chunks of 100 tokens go in as
    (100, 1, columns), each token a sample, as our Hessian counts them."""
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight.data = weight.clone()
    gptq_ = _RefGPTQ(layer)
    gptq_.quantizer = _RefQuantizer()
    gptq_.quantizer.configure(bits, perchannel=True, sym=True)
    for chunk in x.split(100):
        gptq_.add_batch(chunk[:, None, :], None)
    gptq_.fasterquant(groupsize=group or -1, actorder=act_order, static_groups=True)
    return layer.weight.data


@pytest.mark.parametrize("fmt, group, act_order, dead", [
    ("gptq-int4", 32, True, True), ("gptq-int4", 128, True, True), ("gptq-int4", 128, False, True),
    ("gptq-int4", None, True, False), ("w8a8", None, True, False)])
def test_gptq_matches_a_transcription_of_the_reference_implementation(fmt, group, act_order, dead):
    """Our grid is compressed-tensors' (grid.py), the reference's its own Quantizer: sym, [-8, 7] or [-128, 127],
    step 2 max|w| / (2^bits - 1). Per channel, the reference takes the step before zeroing the columns no token
    reached and we after (as it does for groups): those cases go without such a column."""
    args = grid.scheme(fmt, group or 128).weights
    if group is None:
        args = args.model_copy(update={"group_size": None, "strategy": "channel"})
    torch.manual_seed(3)
    weight = torch.randn(40, 256) * 0.05
    x = _inputs(600, 256, outliers=4)
    if dead:
        x[:, 5] = 0.0
    hessian = gptq.Hessian(256, x.device)
    for chunk in x.split(100):
        hessian.add(chunk)
    rounded, scale, _ = gptq.quantize(weight, gptq.inverse_factor(hessian, act_order), args, torch.float32)
    expected = _reference(weight, x, args.num_bits, group, act_order)
    assert torch.allclose(rounded, expected, atol=1e-6), (rounded - expected).abs().max()
    steps = scale.repeat_interleave(group, dim=1) if group else scale
    codes = rounded / steps
    assert torch.allclose(codes, codes.round(), atol=1e-4)  # every column on its own group's grid: no g_idx


def test_the_inverse_factor_is_made_in_hs_own_memory_and_equals_the_copying_calls():
    """One H-sized matrix for the whole factorisation (the permutation and the three steps write over H), with
    the values the copying calls give, on an H whose accumulated rounding left it not quite symmetric."""
    torch.manual_seed(5)
    x = _inputs(500, 300, outliers=3)
    x[:, 11] = 0.0
    for act_order in (True, False):
        running = gptq.Hessian(300, x.device)
        for chunk in x.split(100):
            running.add(chunk)
        running.matrix += torch.randn(300, 300) * 1e-6
        hessian = running.matrix.clone()
        storage = running.matrix.data_ptr()
        solve = gptq.inverse_factor(running, act_order)
        assert solve.inverse.data_ptr() == storage
        dead = torch.diag(hessian) == 0
        hessian[dead, dead] = 1.0
        if act_order:
            hessian = hessian[solve.order][:, solve.order]
        hessian.diagonal().add_(gptq.DAMPING * torch.mean(torch.diag(hessian)))
        expected = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True)
        assert torch.equal(solve.inverse, expected)


def test_errors_spread_a_band_of_columns_at_a_time_round_as_the_reference(monkeypatch):
    """SPREAD narrower than the weight: the later columns get each block's errors in several products."""
    monkeypatch.setattr(gptq, "SPREAD", 48)
    args = grid.scheme("gptq-int4", 32).weights
    torch.manual_seed(4)
    weight = torch.randn(24, 256) * 0.05
    x = _inputs(400, 256, outliers=4)
    hessian = gptq.Hessian(256, x.device)
    for chunk in x.split(100):
        hessian.add(chunk)
    rounded, _, _ = gptq.quantize(weight, gptq.inverse_factor(hessian, True), args, torch.float32)
    expected = _reference(weight, x, args.num_bits, 32, True)
    assert torch.allclose(rounded, expected, atol=1e-6), (rounded - expected).abs().max()


def test_activation_order_rounds_columns_in_a_different_order_from_the_stored_one():
    """The two orders give different weights (else the test above could not tell them apart)."""
    args = grid.scheme("gptq-int4", 32).weights
    torch.manual_seed(3)
    weight = torch.randn(40, 256) * 0.05
    x = _inputs(600, 256, outliers=4)
    results = []
    for act_order in (True, False):
        hessian = gptq.Hessian(256, x.device)
        hessian.add(x)
        results.append(gptq.quantize(weight, gptq.inverse_factor(hessian, act_order), args, torch.float32)[0])
    assert not torch.equal(*results)


def test_a_hessian_that_cannot_be_factored_falls_back_to_rounding_to_nearest():
    args = grid.scheme("gptq-int4", 32).weights
    torch.manual_seed(4)
    linears = [torch.nn.Linear(64, 16, bias=False) for _ in range(2)]
    weights = [m.weight.detach().clone() for m in linears]
    qparams: dict = {}
    unit = gptq.GptqUnit(linears, args, torch.float32, qparams)
    unit.add(_inputs(50, 64))
    unit.hessian.matrix.diagonal().mul_(-1.0)  # not positive definite, whatever the damping adds
    unit.finish()
    assert unit.fallbacks == linears
    for linear, weight in zip(linears, weights):
        scale, _ = grid.weight_qparams(weight, args, torch.float32)
        assert torch.equal(linear.weight, grid.fake_quantize(weight, scale, args))
        assert torch.equal(qparams[linear][0], scale)


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


def test_a_gptq_export_reports_its_layers_as_write_details_and_names_a_layer_rounded_to_nearest(llama_run, tmp_path,
                                                                                                   monkeypatch):
    factored = gptq.inverse_factor
    calls = []

    def first_fails(running, act_order=True):  # layer 0's q/k/v: their Cholesky step fails
        calls.append(1)
        solve = factored(running, act_order)
        return gptq.Solve(None, solve.dead, solve.order) if len(calls) == 1 else solve

    monkeypatch.setattr(gptq, "inverse_factor", first_fails)
    events, report = export(llama_run, "gptq-int4", out=str(tmp_path / "told"), calibration_samples=4)
    details = [e["detail"] for e in events if e["type"] == "PhaseChanged" and e["detail"].startswith("gptq: layer")]
    assert details and all(re.fullmatch(r"gptq: layer \d+/\d+, \d+ s left", d) for d in details), details
    numbers = [int(re.search(r"layer (\d+)/", d).group(1)) for d in details]
    assert numbers == list(range(1, numbers[-1] + 1)) and numbers[-1] == int(re.search(r"/(\d+),", details[-1]).group(1))
    fallen = [n for n in report["notes"] if "to nearest" in n]
    assert fallen == ["GPTQ rounded model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj, "
                      "model.layers.0.self_attn.v_proj to nearest: the Cholesky factorisation of their inputs' "
                      "Hessian failed even damped (more or more varied calibration samples may avoid it)"], report["notes"]
    assert report["outcome"] == "passed"
