"""Calibration one decoder layer at a time (backend/export/calibrated/collect.py): the layers run on their cached
inputs compute what the whole model computes, each layer's statistics see the earlier layers quantized, a unit
with `add_call` gets its module's whole call, and a unit outside the decoder layers is refused."""

from __future__ import annotations

import pytest
import torch

from backend.export.calibrated import collect, grid, gptq, layers
from tests.families import tiny_config

torch.set_num_threads(1)
ROWS = [list(range(3, 3 + n)) for n in (45, 20, 7)]  # longer than gemma3's sliding window (32), and padded


def _model(family: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny_config(family), dtype=torch.float32).eval()


class Inputs:
    """A unit that keeps the real-token inputs its module gets (finish changes nothing)."""

    cost = 0

    def __init__(self, module: torch.nn.Module):
        self.module, self.seen = module, []

    def add(self, x: torch.Tensor) -> None:
        self.seen.append(x.clone())

    def finish(self) -> None:
        pass


def _whole_model_inputs(model: torch.nn.Module, module: torch.nn.Module) -> list[torch.Tensor]:
    """`module`'s real-token inputs in plain forward passes over collect's own batches."""
    seen: list[torch.Tensor] = []
    handle = module.register_forward_pre_hook(lambda m, args: seen.append(args[0][current.bool()].clone()))
    try:
        with torch.no_grad():
            for ids, current in collect._batches(ROWS):
                model(input_ids=ids, attention_mask=current, use_cache=False)
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])  # gemma3: a sliding and a full layer, masks of each
def test_layers_run_one_at_a_time_compute_what_the_whole_model_computes(family):
    model = _model(family)
    _, stack = layers.decoder_layers(model)
    last = Inputs(stack[-1].mlp.down_proj)
    assert collect.calibrate(model, ROWS, [last], budget=1 << 30) == 1
    expected = _whole_model_inputs(model, stack[-1].mlp.down_proj)
    assert len(last.seen) == len(expected)
    for got, want in zip(last.seen, expected):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_a_layers_hessian_is_taken_from_the_quantized_earlier_layers_outputs():
    model = _model("llama")
    _, stack = layers.decoder_layers(model)
    args, qparams = grid.scheme("gptq-int4", 32).weights, {}
    first = {n: m for n, m in layers.quantized_linears(model).items() if ".layers.0." in n}
    units = [gptq.GptqUnit(g, args, torch.float32, qparams) for g in gptq.shared_inputs(first)]
    second = Inputs(stack[1].self_attn.q_proj)
    unquantized = _whole_model_inputs(model, second.module)
    collect.calibrate(model, ROWS, units + [second], budget=1 << 30)
    assert len(qparams) == len(first)  # layer 0 was quantized before layer 1's inputs were taken
    quantized = _whole_model_inputs(model, second.module)  # layer 0 quantized now
    hessian, before, after = (gptq.Hessian(64, torch.device("cpu")) for _ in range(3))
    for target, seen in ((hessian, second.seen), (before, unquantized), (after, quantized)):
        for x in seen:
            target.add(x)
    assert torch.allclose(hessian.matrix, after.matrix, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(hessian.matrix, before.matrix, atol=1e-3, rtol=1e-3)


def test_a_unit_with_add_call_gets_its_modules_whole_call():
    model = _model("llama")
    _, stack = layers.decoder_layers(model)

    class Calls(Inputs):
        def add_call(self, args: tuple, kwargs: dict) -> None:
            self.seen.append((args, kwargs))

    unit = Calls(stack[1].self_attn)
    collect.calibrate(model, ROWS, [unit], budget=1 << 30)
    batches = collect._batches(ROWS)
    assert len(unit.seen) == len(batches)
    for (args, kwargs), (ids, _) in zip(unit.seen, batches):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        assert hidden.shape == (*ids.shape, 64)  # padding included
        assert "position_embeddings" in kwargs and "attention_mask" in kwargs


def test_a_unit_outside_the_decoder_layers_is_refused():
    model = _model("llama")
    with pytest.raises(ValueError, match="outside the decoder layers"):
        collect.calibrate(model, ROWS, [Inputs(model.lm_head)], budget=1 << 30)


def test_the_thread_count_is_measured_on_a_layer_told_and_restored(monkeypatch):
    """With more than one thread the calibration times decoder layer 0 at each count it tries (thread_choice),
    says what it chose, and leaves torch at the count it found; with one it measures nothing."""
    from backend.training.shortcuts import thread_choice

    chosen = []

    def choose(step, start, **kwargs):
        step()  # the measured pass runs a real layer on a real batch
        chosen.append(start)
        torch.set_num_threads(1)
        return thread_choice.ThreadChoice(1, {start: 0.2, 1: 0.1})

    monkeypatch.setattr(thread_choice, "choose_threads", choose)
    model = _model("llama")
    _, stack = layers.decoder_layers(model)
    told: list[str] = []
    torch.set_num_threads(2)
    try:
        collect.calibrate(model, ROWS, [Inputs(stack[0].mlp.down_proj)], budget=1 << 30, name="gptq", tell=told.append)
        assert torch.get_num_threads() == 2 and chosen == [2]
        assert told[0].startswith("gptq: 1 CPU thread (one decoder layer on one batch measured: 2 threads 200 ms")
    finally:
        torch.set_num_threads(1)
    told.clear()
    collect.calibrate(model, ROWS, [Inputs(stack[0].mlp.down_proj)], budget=1 << 30, name="gptq", tell=told.append)
    assert chosen == [2] and told == ["gptq: layer 1/2, 0 s left"]


def test_fp32_products_rounded_a_slice_at_a_time_equal_the_whole_fp32_output():
    """verify.fp32_linear writes each slice of output rows into the 16-bit result as it makes it (no whole fp32
    output): the values of the fp32 product concatenated, biased and rounded once."""
    from backend.export.verify import fp32_linear

    torch.manual_seed(7)
    linear = torch.nn.Linear(4096, 4100).to(torch.bfloat16)  # 4096 rows a slice: two slices
    x = torch.randn(2, 3, 4096).to(torch.bfloat16)
    x32, weight = x.float(), linear.weight
    whole = torch.cat([torch.nn.functional.linear(x32, weight[i:i + 4096].float()) for i in (0, 4096)], dim=-1)
    expected = (whole + linear.bias.float()).to(torch.bfloat16)
    got = fp32_linear(linear, x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
