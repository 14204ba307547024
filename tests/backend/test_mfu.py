"""MFU's FLOPs per token: 6 per trained matmul weight, 4 per frozen one (no weight gradient)."""

from __future__ import annotations

import torch

from backend.training.mfu import flops_per_token, matmul_params


def test_frozen_weights_count_four_flops_and_trained_six(bundled_model):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32)
    c = model.config
    attention = 12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * 100
    linears = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert matmul_params(model) == (linears, 0)  # full fine-tuning: every weight trains
    assert flops_per_token(model, 100) == 6.0 * linears + attention

    lora = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    adapters = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert matmul_params(lora) == (adapters, linears)
    assert flops_per_token(lora, 100) == 4.0 * linears + 6.0 * adapters + attention


def test_measuring_the_peak_leaves_the_runs_random_state_alone():
    # The worker re-measures the peak after choosing its thread count, mid-run: dropout and data
    # order must come out as if it had not.
    from backend.training.mfu import _measure

    torch.manual_seed(1)
    before = torch.get_rng_state()
    assert _measure("cpu", torch.float32) > 0
    assert torch.equal(torch.get_rng_state(), before)
