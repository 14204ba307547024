"""The estimate's families: each config.json read in its own keys, parameter counts equal to what
transformers builds (tiny and real configs, on the meta device), one-line errors for unusable
config.json files, the seed article's GPT-2 XL figures, and the step's peak under checkpointing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import ESTIMATE_FAMILIES as FAMILIES, count_params, estimate, read_dims
from tests.backend.test_estimate import _bench
from tests.conftest import PRESET, ROOT
from tests.families import FAMILIES as TINY

GPT2_XL = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2", "n_ctx": 1024, "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024,
    "output_past": True, "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True, "vocab_size": 50257,
}
"""openai-community/gpt2-xl's config.json: the seed article's 1.5 B example."""

GEMMA3_MULTIMODAL = {
    "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 16,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 64, "patch_size": 8,
                      "vision_use_head": False},
}


def run(**technique) -> RunConfig:
    train = technique.pop("train", {})
    return RunConfig.from_dict({"technique": technique, "train": train})


def meta_count(config) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


# --- parameter counts equal transformers' --------------------------------------------------------


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_family_parameter_count_is_what_transformers_builds(family):
    from tests.families import tiny_config

    arch, dims, warnings = read_dims(dict(TINY[family]))
    assert arch.family == ("llama" if family == "mistral" else family) and not warnings
    assert count_params(arch, dims).total == meta_count(tiny_config(family))


def _image_side_params(raw):
    from backend.estimate.towers import vision_family
    from backend.estimate.vision_towers import tower_shape

    family = vision_family(raw)
    shape = tower_shape(raw, family) if family else None
    return shape.tower_params + shape.projector_params if shape else 0


def test_gemma3_multimodal_counts_its_vision_tower():
    """The text decoder's count leaves the proven tower to the estimate's vision rows (estimate/vision_rows.py)."""
    from transformers import AutoConfig

    arch, dims, warnings = read_dims(GEMMA3_MULTIMODAL)
    counts = count_params(arch, dims)
    assert arch.family == "gemma3_text" and counts.extra == 0 and not warnings
    tower = _image_side_params(GEMMA3_MULTIMODAL)
    assert counts.total + tower == meta_count(AutoConfig.for_model(**GEMMA3_MULTIMODAL))
    b = estimate(GEMMA3_MULTIMODAL, run(method="full"), device="cpu")
    assert b.details["trainable_parameters"] == counts.total  # a frozen tower gets no gradients
    assert b.vision_tower == b.details["vision"]["tower"]["weights"] > 0 and b.details["vision"]["tower"]["trained"] == 0


try:  # the real config.json fixtures (tests/fixtures/model_configs) and their meta-device builder
    from tests import model_configs
except ImportError:  # pragma: no cover - a checkout without them
    model_configs = None


@pytest.mark.skipif(model_configs is None, reason="tests/model_configs.py (real config.json fixtures) not present")
@pytest.mark.parametrize("name", model_configs.names() if model_configs else [])
def test_real_config_parameter_count_is_what_transformers_builds(name):
    """Exactly equal for every published config.json in tests/fixtures/model_configs (a multimodal one
    with its vision tower, which AutoModelForCausalLM loads and training holds)."""
    raw = model_configs.load(name)
    arch, dims, _ = read_dims(raw)
    built = model_configs.meta_model(name, text_only=False)
    assert count_params(arch, dims).total + _image_side_params(raw) == model_configs.parameter_count(built)
    # A VLM's packing is itself a shortcut (packed_image_rows: shortcuts off pads), and its one long row
    # holds a little more than the padded rows (sdpa_packed's joined output): compare the others padded.
    packing = {"packing": False} if "vision_config" in raw else {}
    for method in ("qlora", "lora", "full"):  # estimates at real size, without a note of an unknown family
        b = estimate(raw, run(method=method, gradient_checkpointing=True, **packing), device="cuda")
        # The sum of the parts bounds the peak of the plain step; with the chunked loss (CUDA's default)
        # the logits part no longer covers full tuning's tied-embedding transients (backward_end).
        plain = estimate(raw, run(method=method, gradient_checkpointing=True, shortcuts="off", **packing),
                         device="cuda")
        assert 0 < b.total_bytes <= plain.total_bytes <= plain.sum_bytes and b.details["model"]["measured"]


def test_dimensions_left_to_the_class_are_said_once():
    b = estimate(model_configs.load("google--gemma-3-4b-it"), run(), device="cuda")
    notes = [w for w in b.details["warnings"] if "defaults" in w]
    assert len(notes) == 1 and "num_attention_heads 8" in notes[0] and "vocab_size 262208" in notes[0]


def test_family_defaults_are_the_config_classes_defaults():
    """A key config.json leaves out takes the default of the family's transformers config class."""
    from transformers import AutoConfig

    for model_type, (_, defaults) in FAMILIES.items():
        config = AutoConfig.for_model(model_type)
        for key, value in defaults.items():
            if key in ("mlp_only_layers", "sliding_window_pattern", "n_inner", "head_dim") or not hasattr(config, key):
                continue
            assert getattr(config, key) == value, f"{model_type}.{key}"
    assert AutoConfig.for_model("gemma2").layer_types[:2] == ["sliding_attention", "full_attention"]
    assert AutoConfig.for_model("gemma3_text").layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert AutoConfig.for_model("qwen3").head_dim == FAMILIES["qwen3"][1]["head_dim"]


# --- the seed article: GPT-2 XL, 16 bytes per parameter ------------------------------------------


def test_gpt2_xl_full_mixed_precision_adam_is_16_bytes_per_parameter():
    """The first seed article: 1.5 B parameters, mixed-precision Adam 16 bytes each -> about 24 GB."""
    b = estimate(GPT2_XL, run(method="full", precision="bf16"), device="cuda")
    params = b.details["model"]["parameters"]
    assert params == 1_557_611_200  # GPT2LMHeadModel of this config, tied head counted once
    states = b.weights + b.gradients + b.optimizer + b.master_weights
    assert states / params == pytest.approx(16, rel=1e-3)
    assert states / 1e9 == pytest.approx(24.9, abs=0.1)  # "1.5B parameters ~ 24GB"
    act = b.details["activations"]["per_layer_items"]
    assert "attn_resid_dropout.mask" in act and "mlp_resid_dropout.mask" in act  # dropout 0.1 trains with masks


def test_cli_estimate_on_gpt2_xl_prints_a_table(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GPT2_XL), encoding="utf-8")
    done = _cli("estimate", str(PRESET), "--set", f"model.path={tmp_path}", "--set", "technique.method=full")
    assert done.returncode == 0, done.stderr
    assert "total (peak)" in done.stdout and "GiB" in done.stdout and "Traceback" not in done.stderr
    assert "16.0 bytes x 1.56 B parameters = 24.9 GB" in done.stdout  # the seed article's 16 bytes, ~24 GB


# --- one-line errors, never a traceback ------------------------------------------------------------


@pytest.mark.parametrize("change, key", [
    ({"hidden_size": None}, "hidden_size"),
    ({"hidden_size": "4096"}, "hidden_size"),
    ({"num_hidden_layers": -2}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"vocab_size": True}, "vocab_size"),
    ({"intermediate_size": 1.5}, "intermediate_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"model_type": 7}, "model_type"),
])
def test_unusable_keys_are_one_line_errors(change, key):
    raw = {**TINY["llama"], **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ValueError) as info:
        estimate(raw, run(), device="cpu")
    message = str(info.value)
    assert key in message and "\n" not in message and "config.json" in message


@pytest.mark.parametrize("change, key", [({"n_embd": None}, "n_embd"), ({"n_layer": "48"}, "n_layer"),
                                         ({"attn_pdrop": 2}, "attn_pdrop")])
def test_gpt2_errors_name_gpt2_keys(change, key):
    raw = {k: v for k, v in {**GPT2_XL, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=key):
        read_dims(raw)


def test_files_that_are_not_a_config_are_one_line_errors(tmp_path):
    cases = {"not_json": "{ hidden_size: 1", "a_list": "[1, 2]", "binary": b"\xff\xfe\x00"}
    for name, content in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "config.json"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(ValueError) as info:
            estimate(folder, run(), device="cpu")
        assert str(path) in str(info.value) and "\n" not in str(info.value), name
    with pytest.raises(ValueError, match="no config.json"):
        estimate(tmp_path / "empty", run(), device="cpu")
    vision_only = {"model_type": "llava", "vision_config": {"hidden_size": 32}}
    with pytest.raises(ValueError, match="without text_config"):
        read_dims(vision_only)
    with pytest.raises(ValueError, match="text_config"):
        read_dims({"model_type": "gemma3", "text_config": "gemma"})


def test_cli_turns_a_bad_config_into_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}), encoding="utf-8")
    done = _cli("estimate", str(PRESET), "--set", f"model.path={tmp_path}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ") and "n_embd" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_family_outside_the_table_says_so_in_one_line():
    b = estimate({**TINY["llama"], "model_type": "starcoder2"}, run(), device="cpu")
    notes = [w for w in b.details["warnings"] if "starcoder2" in w]
    assert len(notes) == 1 and "not measured" in notes[0] and "Llama-style" in notes[0]
    assert b.details["model"]["measured"] is False
    assert estimate(dict(TINY["gemma2"]), run(), device="cpu").details["model"]["measured"] is True


# --- family specifics -----------------------------------------------------------------------------


def test_gemma2_runs_eager_and_its_final_softcap_saves_more_logits():
    b = estimate(dict(TINY["gemma2"]), run(attention="sdpa"), device="cpu")
    assert b.details["setup"]["attention"] == "eager" and any("SDPA" in w for w in b.details["warnings"])
    plain = estimate({**TINY["gemma2"], "final_logit_softcapping": None}, run(), device="cpu")
    assert b.logits == plain.logits * 4 // 3  # tanh's output: one more 4-byte logits tensor over 12 B


def test_moe_experts_stay_unquantized_and_say_so():
    cfg = dict(TINY["qwen3_moe"])
    q = estimate(cfg, run(method="qlora", precision="bf16"), device="cuda")
    counts = count_params(*read_dims(cfg)[:2])
    assert q.details["weights"]["bf16"] >= 2 * counts.experts  # kept bf16: the worker undoes peft's fp32 upcast
    assert any("fused experts" in w and "unquantized" in w for w in q.details["warnings"])
    lora = estimate(cfg, run(method="lora"), device="cuda")  # all-linear: the attention only (moe.peft_targets)
    assert not {"router", "experts_gate_up", "experts_down"} & set(lora.details["setup"]["lora_targets"])
    named = estimate(cfg, run(method="lora", lora_targets="q_proj,gate_proj,up_proj,down_proj"), device="cuda")
    assert {"experts_gate_up", "experts_down"} <= set(named.details["setup"]["lora_targets"])
    qwen2 = estimate(dict(TINY["qwen2_moe"]), run(method="lora"), device="cuda")
    assert not {"router", "experts_gate_up"} & set(qwen2.details["setup"]["lora_targets"])  # peft leaves them


# --- the step's peak: with checkpointing, the largest phase, not the sum ---------------------------


def test_total_is_the_largest_phase_and_checkpointing_frees_the_loss_first():
    cfg = dict(TINY["llama"])
    b = estimate(cfg, run(method="full", gradient_checkpointing=True, train={"seq_len": 512}), device="cpu")
    phases = b.details["peak_phases"]
    assert set(phases) >= {"loss_backward", "recompute", "optimizer_step"}
    assert b.total_bytes == phases["peak"] == max(phases["loss_backward"], phases["recompute"], phases["optimizer_step"])
    assert b.total_bytes < b.sum_bytes  # the loss buffers and one recomputed layer never coexist
    data = b.to_json()
    assert data["total_bytes"] == b.total_bytes and data["sum_of_parts_bytes"] == sum(data["breakdown"].values())


# --- a slice of the accuracy matrix across families --------------------------------------------------


def _ci_cases():
    sys.path.insert(0, str(ROOT / "bench"))
    from estimate_cases import CI_SLICE, QUICK

    return [c for c in CI_SLICE if c not in QUICK]


@pytest.mark.parametrize("case", _ci_cases(), ids=lambda c: c.name)
def test_accuracy_slice_across_families(case):
    """Every part within ±10% of the bytes a real step holds; the total within 10% of its peak."""
    import torch

    bench = _bench()
    torch.set_num_threads(1)
    rows = bench.compare(dataclasses.replace(case), "cpu")
    for part in (p for p in bench.PARTS if p in rows):
        predicted, measured, err = rows[part]
        assert abs(err) <= bench.TOLERANCE or predicted == measured == 0, f"{case.name}: {part} {predicted} vs {measured}"
    assert abs(rows["step_peak_total"][2]) <= bench.TOLERANCE


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = ("import sys; from backend.cli.app import main; rc = main(sys.argv[1:]);"
            "assert 'torch' not in sys.modules, 'estimate imported torch'; sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
