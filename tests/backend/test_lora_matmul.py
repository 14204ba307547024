"""Rank-first LoRA products: peft's loss and gradients, and peft's own forward wherever the case is not plain."""

from __future__ import annotations

import pytest
import torch

from backend.training.shortcuts import lora_matmul
from backend.training.shortcuts.lora_matmul import LoraMatmul, LoraProduct


def _peft_model(bundled_model, **lora_kwargs):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32)
    config = LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False, **lora_kwargs)
    return get_peft_model(base, config)


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same dropout masks for both paths
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


def _reference_then_count(bundled_model, monkeypatch, function, **lora_kwargs):
    """peft's own loss and gradients on a fixed batch, then `function.apply` counted from here on."""
    model = _peft_model(bundled_model, **lora_kwargs)
    model.train()
    ids = torch.randint(10, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    loss, grads = _loss_and_grads(model, ids)
    calls = []
    original = function.apply
    monkeypatch.setattr(function, "apply", lambda *a: calls.append(1) or original(*a))
    return model, ids, loss, grads, calls


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_same_loss_and_gradients_as_peft(bundled_model, monkeypatch, dropout):
    model, ids, peft_loss, peft_grads, calls = _reference_then_count(bundled_model, monkeypatch, LoraProduct,
                                                                     lora_dropout=dropout)
    assert LoraMatmul().install(model) == 4 * 7  # every linear of the 4 layers; the tied head is not adapted
    loss, grads = _loss_and_grads(model, ids)
    assert len(calls) == 28
    assert torch.allclose(peft_loss, loss, atol=1e-6)
    assert (peft_grads - grads).abs().max() < 1e-5
    assert peft_grads.abs().max() > 0


def test_the_product_and_its_backward_match_autograd():
    g = torch.Generator().manual_seed(2)
    args = [torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
            for shape in ((7, 5), (7, 6), (3, 6), (5, 3))]  # result (tokens x out), x, A (r x in), B (out x r)
    assert torch.autograd.gradcheck(lambda *t: LoraProduct.apply(*t, 0.75), args)


def test_other_cases_run_peft_forward(bundled_model, monkeypatch):
    """Adapters off, merged, under autocast or in bf16: peft's own forward, and its results."""
    model = _peft_model(bundled_model)
    LoraMatmul().install(model)
    monkeypatch.setattr(LoraProduct, "apply", lambda *a: pytest.fail("the rank-first path ran"))
    ids = torch.randint(10, 200, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with model.disable_adapter():
            model(input_ids=ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(input_ids=ids)
        model.merge_adapter()
        model(input_ids=ids)
        model.unmerge_adapter()
        model.to(torch.bfloat16)
        model(input_ids=ids)


def test_dora_is_left_to_peft(bundled_model):
    model = _peft_model(bundled_model, use_dora=True)
    LoraMatmul().install(model)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert lora_matmul._plain_adapter(layer, torch.zeros(1, 256)) is None


def test_adapter_weights_keep_their_names(bundled_model):
    """Nothing is replaced, only each layer's forward: the adapter saves under peft's keys."""
    from peft import get_peft_model_state_dict

    model = _peft_model(bundled_model)
    before = set(get_peft_model_state_dict(model))
    LoraMatmul().install(model)
    assert set(get_peft_model_state_dict(model)) == before


def test_bf16_base_stays_close_to_fp32_and_keeps_adapters_fp32(bundled_model, monkeypatch):
    """The frozen base in bf16 (the plan's choice on a CPU with native bf16): bf16 rounding, no more."""
    from backend.training.shortcuts.lora_matmul import Bf16Product

    model, ids, fp32_loss, fp32_grads, calls = _reference_then_count(bundled_model, monkeypatch, Bf16Product)
    assert LoraMatmul(bf16_base=True).install(model) == 28
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.base_layer.weight.dtype == torch.bfloat16 and layer.lora_A["default"].weight.dtype == torch.float32
    assert model.base_model.model.model.embed_tokens.weight.dtype == torch.float32  # only the adapted linears
    loss, grads = _loss_and_grads(model, ids)
    assert len(calls) == 28
    assert abs(loss - fp32_loss) / fp32_loss < 5e-3
    cosine = torch.nn.functional.cosine_similarity(grads, fp32_grads, dim=0)
    assert cosine > 0.999, cosine
    assert ((grads - fp32_grads).norm() / fp32_grads.norm()) < 0.05


def test_bf16_product_is_the_product_of_the_rounded_operands():
    from backend.training.shortcuts.lora_matmul import Bf16Product

    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 32, generator=g, requires_grad=True)
    w = torch.randn(16, 32, generator=g).to(torch.bfloat16)
    out = Bf16Product.apply(x, w)
    assert out.dtype == torch.float32
    reference = x.detach().to(torch.bfloat16).double() @ w.double().t()
    assert (out.double() - reference).abs().max() < 0.05  # the output's own bf16 rounding
    grad = torch.randn(9, 16, generator=g)
    out.backward(grad)
    assert x.grad.dtype == torch.float32
    assert (x.grad.double() - grad.to(torch.bfloat16).double() @ w.double()).abs().max() < 0.05


def test_bf16_base_falls_back_to_peft_in_bf16(monkeypatch):
    """Adapters off (or any case not plain): peft's forward runs on the bf16 base, a bias too, and
    hands back the caller's dtype."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 16, bias=True))
    reference = net[0](torch.ones(2, 32)).detach()
    model = get_peft_model(net, LoraConfig(r=4, target_modules=["0"]))
    assert LoraMatmul(bf16_base=True).install(model) == 1
    x = torch.ones(2, 32)
    out = model(x)  # plain path: bias added in fp32 after the bf16 product
    assert out.dtype == torch.float32 and (out - reference).abs().max() < 0.05  # B starts at zero
    monkeypatch.setattr(lora_matmul.LoraProduct, "apply", lambda *a: pytest.fail("the rank-first path ran"))
    with model.disable_adapter():
        off = model(x)
    assert off.dtype == torch.float32 and (off - reference).abs().max() < 0.05
