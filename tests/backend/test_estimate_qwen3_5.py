"""Qwen3.5's decoder in the text estimate: parameters equal to what transformers builds (meta device),
and what one Gated DeltaNet layer and one gated attention layer save for backward against the
saved-tensor meter on the CPU (the PyTorch fallback of the chunked gated delta rule)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Qwen3_5TextConfig = pytest.importorskip("transformers.models.qwen3_5").Qwen3_5TextConfig

from backend.estimate.activations import _layer_plan, _layer_saved  # noqa: E402
from backend.estimate.architectures import count_params  # noqa: E402
from backend.estimate.families import read_dims  # noqa: E402
from backend.estimate.setup import Setup, lora_roles  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from estimate_tensors import _SavedTensorMeter, _storage_key, _unique_bytes  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, vocab_size=1000)


def _meta_total(config) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), len(list(model.parameters()))


@pytest.mark.parametrize("config", [Qwen3_5TextConfig(), Qwen3_5TextConfig(**TINY, full_attention_interval=2)],
                         ids=["default", "tiny-interval-2"])
def test_qwen3_5_parameters_equal_transformers(config):
    arch, dims, warnings = read_dims(config.to_dict())
    assert arch.family == "qwen3_5_text" and not warnings
    counts = count_params(arch, dims)
    assert (counts.total, counts.tensors) == _meta_total(config)


def test_qwen3_5_layer_types_from_the_interval():
    raw = {k: v for k, v in Qwen3_5TextConfig(**TINY).to_dict().items() if k != "layer_types"}
    _, dims, _ = read_dims({**raw, "full_attention_interval": 2})
    assert dims.layer_types == ("linear_attention", "full_attention") * 2
    with pytest.raises(ValueError, match="layer_types"):
        read_dims({**raw, "layer_types": ["linear_attention", "sliding_attention", "x", "y"]})


def _measured(model, index: int, seq: int, batch: int = 1) -> int:
    """Bytes one decoder layer saves (its input, the parameters and the model-wide rotary cos/sin left out)."""
    layer = model.model.layers[index]
    x = torch.randn(batch, seq, TINY["hidden_size"], requires_grad=True)
    pos = torch.arange(seq)[None].expand(batch, -1)
    cos, sin = model.model.rotary_emb(x, pos[None].expand(3, batch, seq))
    known = {_storage_key(t) for t in [*model.parameters(), *model.buffers(), x, cos, sin]}
    with _SavedTensorMeter() as meter:
        out = layer(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
    total, _ = _unique_bytes(meter.live(), known)
    del out
    return total


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_qwen3_5_layers_save_what_the_estimate_counts(mode):
    """Sequences of 100 and 300 tokens (padded to 128 and 320 by the chunked rule) and of 128 (no padding:
    the matmuls copy), fp32, sdpa."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY)).float()
    arch, dims, _ = read_dims(model.config.to_dict())
    if mode == "lora":
        lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
        model = peft.get_peft_model(model, lora).base_model.model
    roles = lora_roles(arch, dims, "all-linear")[0] if mode == "lora" else set()
    plan = _layer_plan(arch, dims)
    assert [t for _, t in plan] == ["linear_attention"] * 3 + ["full_attention"]
    for seq in (100, 300, 128):
        setup = Setup(method=mode, compute_bytes=4, dtype="fp32", adapter_bytes=4, full=mode == "full", quant=None,
                      rank=4, dropout=False, targets=frozenset(roles), attention="sdpa", checkpointing=False,
                      batch=1, seq=seq, device="cpu", weight_bytes=4, residual_bytes=4)
        for index in (0, 3):
            kind, layer_type = plan[index]
            estimated = _layer_saved(arch, dims, setup, kind, True, layer_type).total(without={"x_in"})
            measured = _measured(model, index, seq)
            assert abs(estimated / measured - 1) < 0.005, (mode, seq, layer_type, estimated, measured)


def test_eager_attention_with_one_kv_head_keeps_k_and_v_as_views_for_one_row():
    """repeat_kv's expand + reshape costs nothing for one KV head and one row; two rows copy (GQA as usual)."""
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY)).float()
    model.config._attn_implementation = "eager"
    model.requires_grad_(False)
    arch, dims, _ = read_dims(model.config.to_dict())
    kind, layer_type = _layer_plan(arch, dims)[3]
    for batch in (1, 2):
        setup = Setup(method="lora", compute_bytes=4, dtype="fp32", adapter_bytes=4, full=False, quant=None, rank=4,
                      dropout=False, targets=frozenset(), attention="eager", checkpointing=False, batch=batch, seq=60,
                      device="cpu", weight_bytes=4, residual_bytes=4)
        estimated = _layer_saved(arch, dims, setup, kind, True, layer_type).total(without={"x_in"})
        measured = _measured(model, 3, 60, batch)
        assert abs(estimated / measured - 1) < 0.005, (batch, estimated, measured)
