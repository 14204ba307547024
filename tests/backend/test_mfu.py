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


def test_a_slow_dtype_is_measured_small_and_briefly(monkeypatch):
    """On a CPU that only emulates bf16 the measurement held up the start of every bf16 run: a slow
    first product keeps the operands small, and the trials stop after the budget."""
    from backend.training import mfu

    clock = iter(range(1000))
    monkeypatch.setattr(mfu.time, "perf_counter", lambda: float(next(clock)))  # every product "takes" 1 s
    assert mfu._cpu_operands(torch.float32, torch.Generator().manual_seed(0))[0].shape == (256, 256)
    clock = iter(range(1000))
    assert mfu._measure("cpu", torch.float32) == 2.0 * 256**3  # two trials, then the budget is spent
    assert next(clock) == 2 + 1 + 2 * 2 + 1  # sizing, the start, two trials of two reads, the budget check


def test_the_flops_of_skipped_work_are_not_counted(bundled_model):
    """loss_positions computes the output projection at target positions only, last_layer_rows the last
    layer's MLP and o_proj at those rows only: their FLOPs are counted per such position."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from backend.training.shortcuts.last_layer_rows import LastLayerRows
    from backend.training.mfu import token_flops

    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32),
                          LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    rows = LastLayerRows()
    assert rows.install(lora)
    split = token_flops(lora, 100, rows.patched)
    assert split.per_token == flops_per_token(lora, 100)
    head = lora.get_base_model().lm_head
    assert split.head == 4.0 * head.in_features * head.out_features  # tied to the frozen embedding
    last = lora.get_base_model().model.layers[-1]
    base = [last.mlp.gate_proj, last.mlp.up_proj, last.mlp.down_proj, last.self_attn.o_proj]
    adapters = sum(p.numel() for m in base for n, p in m.named_parameters() if "lora_" in n)
    assert split.last_rows == 4.0 * sum(m.in_features * m.out_features for m in base) + 6.0 * adapters
    assert split.of(300, 30, 30) < split.per_token * 300  # what runs, not what would run without them


def test_fused_experts_count_the_active_share_and_conv1d_counts(tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.families import tiny_config

    mixtral = AutoModelForCausalLM.from_config(tiny_config("mixtral"))
    mixtral.requires_grad_(False)
    c = mixtral.config
    experts = sum(p.numel() for n, p in mixtral.named_parameters() if ".experts." in n)
    routers = c.num_hidden_layers * c.num_local_experts * c.hidden_size
    linears = sum(m.in_features * m.out_features for m in mixtral.modules() if isinstance(m, torch.nn.Linear))
    share = c.num_experts_per_tok / c.num_local_experts
    assert matmul_params(mixtral) == (0, int(linears + routers + share * experts))

    gpt2 = AutoModelForCausalLM.from_config(tiny_config("gpt2"))
    conv = sum(m.weight.numel() for m in gpt2.modules() if type(m).__name__ == "Conv1D")
    assert conv > 0 and matmul_params(gpt2)[0] == conv + gpt2.lm_head.weight.numel()


def test_mfu_credits_what_ran_with_the_shortcuts_on(bundled_model, tmp_path, monkeypatch):
    """The same run with shortcuts auto and off: per useful token, MFU credits exactly the skipped
    output projection and last-layer rows less (mfu / tokens_per_s is FLOPs per useful token / peak)."""
    from backend.training.model import techniques
    from backend.training.mfu import token_flops
    from tests.backend.test_techniques import run_steps

    monkeypatch.setattr("backend.jobs.finetune.peak_flops", lambda device, dtype: 1e11)
    monkeypatch.setattr(techniques, "native_bf16", lambda: False)
    seen = {}
    original = token_flops
    monkeypatch.setattr("backend.jobs.finetune.token_flops", lambda *a: seen.setdefault("split", original(*a)))
    _, on = run_steps(tmp_path / "on", [])
    split = seen.pop("split")
    _, off = run_steps(tmp_path / "off", ["technique.shortcuts=off"])
    per_useful_on, per_useful_off = on["mfu"] / on["tokens_per_s"], off["mfu"] / off["tokens_per_s"]
    assert per_useful_on < per_useful_off
    # off credits per_token at every computed token; on credits head and last rows at the targets only
    computed_per_target = (per_useful_off * 1e11) / split.per_token  # computed tokens per useful token
    expected_on = (split.every * computed_per_target + split.head + split.last_rows) / 1e11
    assert abs(per_useful_on - expected_on) < 1e-6 * expected_on
