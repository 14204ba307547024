"""The memory estimator: its formulas, its JSON, its torch-free import, and a slice of the accuracy
matrix of bench/estimate_accuracy.py (predicted against the bytes a real training step holds)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from backend.core.config.run_config import ConfigError, RunConfig
from backend.estimate import PARTS, Breakdown, estimate, human_bytes, nf4_bytes

ROOT = Path(__file__).resolve().parents[2]

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3"},
    "torch_dtype": "bfloat16",
}

TINY = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
}

NEOX = {
    "model_type": "gpt_neox",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "vocab_size": 4096,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
}


def run_config(**technique) -> RunConfig:
    train = technique.pop("train", {})
    offload = technique.get("offload", "none")
    hardware = {"strategy": "deepspeed_zero3" if offload == "zero3_optimizer_params" else "deepspeed_zero2"} \
        if offload != "none" else {}
    return RunConfig.from_dict({"technique": technique, "train": train, "hardware": hardware})


def llama_params(c: dict) -> int:
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i + 2 * h
    return layers * per_layer + h + v * h * (1 if c["tie_word_embeddings"] else 2)


# --- the isolation rule -------------------------------------------------------------------------


def test_estimate_does_not_import_torch():
    code = "import backend.estimate, sys; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- model states: the ZeRO paper's 16 bytes per parameter ---------------------------------------


def test_full_fp32_adam_is_16_bytes_per_parameter():
    b = estimate(TINY, run_config(method="full", precision="fp32"), device="cpu")
    params = llama_params(TINY)
    assert b.details["model"]["parameters"] == params
    assert b.master_weights == 0
    assert b.gradients == 4 * params
    tensors = 4 * 9 + 3  # 7 linears + 2 norms per layer; embedding, final norm, lm_head
    assert b.optimizer == 8 * params + 4 * tensors  # two fp32 moments + torch's 4-byte step per tensor
    states = b.weights + b.gradients + b.optimizer
    assert states / params == pytest.approx(16, rel=1e-3)


@pytest.mark.parametrize("autocast", [False, True])
def test_mixed_precision_full_is_16_bytes_per_parameter(autocast):
    """The seed article's 16Φ: 2 + 2 (bf16 weights, gradients) + 4 (fp32 master) + 4 + 4 (moments);
    the Trainer's autocast keeps fp32 weights and gradients instead, also 16 bytes."""
    b = estimate(LLAMA_70B, run_config(method="full", precision="bf16"), device="cuda", autocast=autocast)
    params = b.details["model"]["parameters"]
    per_param = (b.weights + b.gradients + b.optimizer + b.master_weights) / params
    assert per_param == pytest.approx(16, rel=1e-4)
    if autocast:
        assert (b.weights / params, b.gradients / params, b.master_weights) == (pytest.approx(4, rel=1e-6), 4, 0)
    else:
        assert b.gradients == 2 * params and b.master_weights == 4 * params
    # 1.5B parameters -> 24 GB, as in the seed article
    assert 16 * 1.5e9 / 1e9 == 24


def test_zero_stages_shard_what_the_paper_says():
    run = run_config(method="full", precision="bf16")
    # DeepSpeed holds the model in bf16 with an fp32 master copy: compare like with like.
    base = estimate(LLAMA_70B, run, device="cuda", num_gpus=8, zero_stage=0, autocast=False)
    z1 = estimate(LLAMA_70B, run, device="cuda", num_gpus=8, zero_stage=1)
    z2 = estimate(LLAMA_70B, run, device="cuda", num_gpus=8, zero_stage=2)
    z3 = estimate(LLAMA_70B, run, device="cuda", num_gpus=8, zero_stage=3)
    assert z1.details["setup"]["autocast"] is False
    assert z1.optimizer == pytest.approx(base.optimizer / 8, rel=1e-6)
    assert z1.master_weights == pytest.approx(base.master_weights / 8, rel=1e-6)
    assert z2.gradients == pytest.approx(z1.gradients / 8, rel=1e-6)
    assert z3.weights < z2.weights / 4
    assert base.gradients == 2 * z1.gradients  # DDP buckets: a second copy of the gradients
    off = estimate(LLAMA_70B, run_config(method="full", precision="bf16", offload="zero2_optimizer"), device="cuda")
    assert off.optimizer == 0 and off.master_weights == 0 and off.details["distributed"]["cpu_offloaded_bytes"] > 0


def test_eight_bit_adam_is_about_2_bytes_per_parameter():
    run = run_config(method="full", precision="bf16", optimizer="adamw_8bit")
    b = estimate(LLAMA_70B, run, device="cuda")
    per_param = b.optimizer / b.details["model"]["parameters"]
    assert 2.0 < per_param < 2.05  # 2 B + one fp32 absmax per 256 values and state


# --- weights by storage type ----------------------------------------------------------------


def test_nf4_with_double_quantization_is_about_half_a_byte_per_parameter():
    one = nf4_bytes(64 * 256 * 1000)
    per_param = (one["data"] + one["constants"]) / (64 * 256 * 1000)
    assert per_param == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256), abs=1e-4)  # 4.127 bits (QLoRA paper)
    single = nf4_bytes(64 * 256 * 1000, double_quant=False)
    assert single["constants"] / (64 * 256 * 1000) == pytest.approx(4 / 64, abs=1e-4)  # 0.5 bit


def test_qlora_weights_of_a_70b_model():
    b = estimate(LLAMA_70B, run_config(method="qlora"), device="cuda")
    w = b.details["weights"]
    linear = b.details["model"]["linear_parameters"]
    assert w["nf4"] == linear // 2
    assert (w["nf4"] + w["nf4_constants"]) / linear == pytest.approx(0.5159, abs=5e-4)
    assert w["double_quant"] is True
    # the rest (embeddings, lm_head, norms) is unquantized: fp32 after prepare_model_for_kbit_training
    rest = b.details["model"]["parameters"] - linear
    assert w["fp32"] == pytest.approx(4 * rest, rel=1e-6)
    held_in_bf16 = estimate(LLAMA_70B, run_config(method="qlora"), device="cuda", autocast=False)
    assert held_in_bf16.details["weights"]["bf16"] == 2 * rest
    assert b.weights / 2**30 < 48  # the seed: a 65B QLoRA fine-tune fits in 48 GB of weights and more


def test_lora8_weights_are_one_byte_per_linear_parameter_plus_row_scales():
    b = estimate(TINY, run_config(method="lora8", precision="bf16"), device="cpu", autocast=False)
    w = b.details["weights"]
    assert w["int8"] == b.details["model"]["linear_parameters"]
    assert w["int8_scales"] == 4 * 4 * (256 + 128 + 128 + 256 + 768 + 768 + 256)


# --- adapters -----------------------------------------------------------------------------


def test_lora_parameters_are_r_times_in_plus_out_per_targeted_linear():
    r = 8
    b = estimate(TINY, run_config(method="lora", lora_rank=r), device="cpu")
    dims = [(256, 256), (256, 128), (256, 128), (256, 256), (256, 768), (256, 768), (768, 256)]
    expected = 4 * sum(r * (i + o) for i, o in dims)
    assert b.details["adapter_parameters"] == expected
    assert b.adapters == 4 * expected and b.gradients == 4 * expected
    qv = estimate(TINY, run_config(method="lora", lora_rank=r, lora_targets="q_proj,v_proj"), device="cpu")
    assert qv.details["adapter_parameters"] == 4 * r * (256 + 256 + 256 + 128)
    dora = estimate(TINY, run_config(method="dora", lora_rank=r), device="cpu")
    assert dora.details["adapter_parameters"] == expected + 4 * sum(o for _, o in dims)  # + magnitude


def test_unknown_lora_target_is_reported():
    b = estimate(TINY, run_config(method="lora", lora_targets="q_proj,nonsense"), device="cpu")
    assert any("nonsense" in w for w in b.details["warnings"])


# --- activations ----------------------------------------------------------------------------


def test_checkpointing_keeps_layer_inputs_plus_one_layer():
    run = run_config(method="lora", gradient_checkpointing=True, attention="sdpa", train={"seq_len": 1024, "micro_batch_size": 2})
    b = estimate(LLAMA_70B, run, device="cuda")
    act = b.details["activations"]
    assert act["with_checkpointing"] == b.activations
    assert act["with_checkpointing"] < act["without_checkpointing"] / 10
    tokens_hidden = 2 * 1024 * 8192 * 2  # bf16 layer inputs
    assert act["checkpointed_inputs"] == 80 * tokens_hidden
    # the norm saves an fp32 copy of its bf16 input, so the input itself is not in the layer's set
    assert act["recompute_one_layer"] == act["per_layer"] - act["per_layer_items"].get("x_in", 0)


def test_attention_scores_only_for_eager():
    eager = estimate(TINY, run_config(attention="eager", packing=False, train={"seq_len": 512}), device="cpu")
    sdpa = estimate(TINY, run_config(attention="sdpa", packing=False, train={"seq_len": 512}), device="cpu")
    assert eager.details["activations"]["attention_scores_per_layer"] == 8 * 4 * 512 * 512 * 4
    assert sdpa.details["activations"]["attention_scores_per_layer"] == 0
    assert eager.activations > sdpa.activations


def test_packed_rows_make_eager_scores_grow_with_the_row():
    """Packing 8 examples into one row: the eager score matrix is (8 x 512)^2, not 8 x 512^2."""
    packed = estimate(TINY, run_config(attention="eager", train={"seq_len": 512}), device="cpu")
    assert packed.details["activations"]["attention_scores_per_layer"] == 4 * (8 * 512) ** 2 * 4


def test_grouped_query_attention_saves_less_than_full_heads_with_sdpa():
    gqa = estimate({**TINY, "num_key_value_heads": 1}, run_config(method="full"), device="cpu")
    mha = estimate({**TINY, "num_key_value_heads": 4}, run_config(method="full"), device="cpu")
    assert gqa.activations < mha.activations
    assert gqa.details["model"]["parameters"] < mha.details["model"]["parameters"]


def test_activations_grow_linearly_with_batch_and_logits_with_vocab():
    one = estimate(TINY, run_config(attention="sdpa", train={"micro_batch_size": 1}), device="cpu")
    four = estimate(TINY, run_config(attention="sdpa", train={"micro_batch_size": 4}), device="cpu")
    assert four.logits == 4 * one.logits == 4 * 12 * 256 * 4096  # 12 B per logit: log-probs + 2 grads
    two = estimate(TINY, run_config(attention="sdpa", train={"micro_batch_size": 2}), device="cpu")
    # linear from two examples a row on; one example alone skips sdpa_packed's cat of the outputs
    assert 1.75 < four.activations / two.activations <= 2 and 3.5 < four.activations / one.activations <= 4.25


def test_logits_count_the_longest_answer_when_the_data_is_measured():
    """The worker projects logits only at loss positions: at most micro_batch x the longest answer."""
    run = run_config(attention="sdpa", train={"micro_batch_size": 4, "seq_len": 256})
    worst = estimate(TINY, run, device="cpu")
    measured = estimate(TINY, run, device="cpu", target_tokens=40)
    assert worst.logits == 4 * 256 * 4096 * 12 and worst.details["logits"]["positions"] == 4 * 256
    assert measured.logits == 4 * 40 * 4096 * 12 and measured.details["logits"]["positions"] == 160
    assert measured.total_bytes < worst.total_bytes and measured.activations == worst.activations
    # an answer longer than seq_len is cut to it; raw text (every token a target) is the worst case
    assert estimate(TINY, run, device="cpu", target_tokens=10_000).logits == worst.logits
    liger = run_config(attention="sdpa", liger_kernel=True, train={"micro_batch_size": 4, "seq_len": 256})
    assert estimate(TINY, liger, device="cuda", target_tokens=40).logits == estimate(TINY, liger, device="cuda").logits


def test_gpt_neox_is_supported_and_differs_from_llama():
    b = estimate(NEOX, run_config(method="full"), device="cpu")
    assert b.details["model"]["family"] == "gpt_neox"
    h, i, v = 256, 1024, 4096
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h) + 4 * h
    assert b.details["model"]["parameters"] == 3 * per_layer + 2 * h + 2 * v * h
    assert not b.details["warnings"]


def test_unknown_architecture_is_estimated_with_a_warning():
    b = estimate({**TINY, "model_type": "mystery"}, run_config(), device="cpu")
    assert b.total_bytes > 0 and "mystery" in b.details["warnings"][0]


# --- devices, precision, runtime -------------------------------------------------------------


def test_precision_auto_is_fp32_on_cpu_and_bf16_on_cuda():
    run = run_config(method="lora")
    cpu = estimate(TINY, run, device="cpu")
    cuda = estimate(TINY, run, device="cuda")
    assert cpu.details["setup"]["precision"] == "fp32" and cpu.runtime == 0
    assert cuda.details["setup"]["precision"] == "bf16" and cuda.runtime > 0
    assert cuda.weights < cpu.weights
    assert estimate(TINY, run, device="cuda", bf16_supported=False).details["setup"]["precision"] == "fp16"


# --- input forms and output forms ------------------------------------------------------------


def test_a_70b_folder_holding_only_config_json(tmp_path, monkeypatch):
    folder = tmp_path / "llama-70b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B), encoding="utf-8")
    run = run_config(method="qlora", gradient_checkpointing=True)
    from_folder = estimate(folder, run, device="cuda")
    assert from_folder.details["model"]["parameters"] == pytest.approx(70.55e9, rel=1e-3)
    assert from_folder.to_json() == estimate(str(folder / "config.json"), run, device="cuda").to_json()
    monkeypatch.setenv("FINETUNE_STUDIO_RESOURCES", str(tmp_path))
    assert estimate("bundled:llama-70b", run, device="cuda").total_bytes == from_folder.total_bytes


def test_missing_config_json_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        estimate(tmp_path, run_config(), device="cpu")


def test_json_and_table():
    b = estimate(LLAMA_70B, run_config(method="qlora"), device="cuda")
    data = b.to_json()
    assert set(data) == {"total_bytes", "sum_of_parts_bytes", "breakdown"}
    assert list(data["breakdown"]) == [*PARTS, "allocator_reserve", "cuda_context"]  # CUDA's parts of their own
    assert list(PARTS) == [
        "weights", "adapters", "gradients", "optimizer", "master_weights", "activations", "logits", "runtime",
    ]
    assert all(isinstance(v, int) for v in data["breakdown"].values())
    assert data["sum_of_parts_bytes"] == sum(data["breakdown"].values()) == b.sum_bytes
    assert data["total_bytes"] == b.total_bytes == b.details["peak_phases"]["peak"] <= b.sum_bytes
    json.dumps(b.to_json(details=True))  # details are JSON-ready too
    table = b.format_table()
    assert "GiB" in table and "%" in table and table.splitlines()[-1].startswith("total") or "note" in table
    assert human_bytes(3 * 2**30) == "3.00 GiB" and human_bytes(5 * 2**20) == "5.0 MiB"


def test_breakdown_total_is_its_peak_else_the_sum_of_its_parts():
    b = Breakdown(weights=1, adapters=2, gradients=3, optimizer=4, master_weights=5, activations=6, logits=7, runtime=8)
    assert b.total_bytes == b.sum_bytes == 36
    b.details["peak_phases"] = {"backward_start": 20, "optimizer_step": 12, "peak": 28}
    assert b.total_bytes == 28 and b.sum_bytes == 36


# --- the config fields the estimate reads ----------------------------------------------------


def test_default_technique_is_plain_lora():
    t = RunConfig().technique
    assert (t.method, t.gradient_checkpointing, t.attention, t.precision, t.optimizer, t.offload) == (
        "lora", False, "auto", "auto", "adamw", "none",
    )
    assert t.neftune_alpha is None and t.packing is True  # padding-free packing is the default


@pytest.mark.parametrize(
    "technique, field",
    [
        ({"attention": "flash_attention_2", "precision": "fp32"}, "technique.attention"),
        ({"optimizer": "adamw_8bit", "offload": "zero2_optimizer"}, "technique.optimizer"),
        ({"method": "lora8", "offload": "zero3_optimizer_params"}, "technique.offload"),
        ({"neftune_alpha": 0}, "technique.neftune_alpha"),
    ],
)
def test_impossible_technique_combinations_are_refused(technique, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RunConfig.from_dict({"technique": technique})


# --- a slice of the accuracy matrix: predicted against measured, every part within ±10% --------


def _bench():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    path = ROOT / "bench" / "estimate_accuracy.py"
    spec = importlib.util.spec_from_file_location("estimate_accuracy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["estimate_accuracy"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_accuracy_slice_on_cpu(index):
    import torch

    bench = _bench()
    torch.set_num_threads(1)
    case = bench.QUICK[index]
    rows = bench.compare(case, "cpu")
    for part in (p for p in PARTS if p in rows):
        predicted, measured, err = rows[part]
        assert abs(err) <= bench.TOLERANCE or (predicted == measured == 0), f"{case.name}: {part} {predicted} vs {measured}"
    assert rows["activations"][1] > 0 and rows["logits"][1] > 0 and rows["weights"][1] > 0
    assert math.isfinite(rows["activations"][2])


def test_cpu_bf16_base_weights_are_the_bytes_the_worker_holds(bundled_model):
    """On a CPU with native bf16 (precision auto, LoRA) the worker holds the adapted linears' frozen
    weights in bf16: the estimate's weights are the model's real parameter bytes after that."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from backend.training.shortcuts.lora_matmul import LoraMatmul

    run = RunConfig.load(ROOT / "resources/presets/tiny_lora.yaml")
    fp32 = estimate(bundled_model, run, device="cpu")
    mixed = estimate(bundled_model, run, device="cpu", cpu_bf16=True)
    model = AutoModelForCausalLM.from_pretrained(bundled_model, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    LoraMatmul(bf16_base=True).install(model)
    held = sum(t.numel() * t.element_size() for n, t in model.named_parameters() if "lora_" not in n)
    held += sum(b.numel() * b.element_size() for b in model.buffers())
    assert mixed.weights == held
    linears = 4 * 256 * (256 + 128 + 128 + 256 + 3 * 768)
    assert fp32.weights - mixed.weights == 2 * linears
    for override in (["technique.precision=fp32"], ["technique.method=dora"]):
        other = RunConfig.load(ROOT / "resources/presets/tiny_lora.yaml", override)
        assert estimate(bundled_model, other, device="cpu", cpu_bf16=True).weights == \
            estimate(bundled_model, other, device="cpu").weights
    assert estimate(bundled_model, run, device="cuda", cpu_bf16=True).breakdown() == estimate(bundled_model, run, device="cuda").breakdown()
