"""Rank-first LoRA products: peft's loss and gradients, and peft's own forward wherever the case is not plain."""

from __future__ import annotations

import pytest
import torch

from backend.training import lora_matmul
from backend.training.lora_matmul import LoraMatmul, LoraProduct


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


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_same_loss_and_gradients_as_peft(bundled_model, monkeypatch, dropout):
    model = _peft_model(bundled_model, lora_dropout=dropout)
    model.train()
    ids = torch.randint(10, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    peft_loss, peft_grads = _loss_and_grads(model, ids)
    calls = []
    original = LoraProduct.apply
    monkeypatch.setattr(LoraProduct, "apply", lambda *a: calls.append(1) or original(*a))
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
