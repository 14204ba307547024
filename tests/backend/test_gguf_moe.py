"""GGUF export of the mixture-of-experts families, tensor by tensor against llama.cpp's converter.

Qwen3-MoE and Mixtral are tiny random-weight models built from the real Qwen3-30B-A3B and
Mixtral-8x7B config.json files (tests/fixtures/model_configs: every key kept, the sizes shrunk; Qwen3's
expert size stays the released 768); Qwen2-MoE, which has no fixture, is tests/families.py's tiny model
(shared expert and its sigmoid gate). Each is written in every GGUF type (F16, Q8_0, Q5_0, Q4_0) from
the in-memory model (fused
3-D `gate_up_proj`/`down_proj`) and from its saved checkpoint (per-expert tensors), and the file must
hold what convert_hf_to_gguf.py (conversion/qwen.py's Qwen2MoeModel/Qwen3MoeModel, llama.py's experts)
writes: the arch's own tensor names (gguf.constants.MODEL_TENSORS), experts stacked as (expert, ...),
the router in F32, the expert keys with the model's values, and the expert weights themselves.
The export's check on each file is recorded: passed, or "not verified" with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from backend.core.registries.export_formats import GGUF_TYPES
from tests import model_configs
from tests.backend.test_gguf_families import SafetensorsSource, fields, write
from tests.families import BUNDLED, FAMILIES, SPECIAL, VOCAB

torch.set_num_threads(1)
SHRUNK: dict[str, tuple[str, dict[str, Any]]] = {
    # family -> (fixture, sizes replaced); the rest of the released config.json as published
    "qwen3_moe": ("Qwen--Qwen3-30B-A3B", dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                                              num_experts=16)),  # head_dim 128, top-8 of 16, expert ffn 768
    "mixtral": ("mistralai--Mixtral-8x7B-v0.1", dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                                                     intermediate_size=64)),  # 8 experts, top 2, as released
    "qwen2_moe": ("", {}),  # tests/families.py: 4 experts of 32, a shared expert of 64
}
ARCH = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "qwen2_moe": "qwen2moe"}
LAYER = {  # what convert_hf_to_gguf.py writes for each block of the arch (`.weight` unless named)
    "qwen3moe": ["attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "attn_norm", "ffn_norm",
                 "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"],
    "llama": ["attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_norm", "ffn_gate_inp", "ffn_gate_exps",
              "ffn_up_exps", "ffn_down_exps"],
    "qwen2moe": ["attn_q", "attn_k", "attn_v", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output", "attn_norm",
                 "ffn_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp",
                 "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"],
}
CHECK = {"qwen3_moe": None, "mixtral": "dense Llama", "qwen2_moe": "failed on this file"}
"""The export check's outcome per family: None = passed (transformers' reader rebuilds Qwen3-30B-A3B's
sizes), else words of why it is not verified: Mixtral is read as a dense Llama; for the tiny Qwen2-MoE
the reader, which has no key for the expert sizes, builds Qwen1.5-MoE's 1408/5632 and the tensors do not fit."""


def config_dict(family: str) -> dict[str, Any]:
    fixture, sizes = SHRUNK[family]
    if not fixture:
        return dict(FAMILIES[family])
    cfg = {k: v for k, v in model_configs.load(fixture).items() if k != "auto_map"}
    cfg.update(sizes, num_hidden_layers=2, vocab_size=VOCAB, **SPECIAL)
    return cfg


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (the fp32 model, its saved folder), built once."""
    from transformers import AutoConfig, AutoModelForCausalLM

    root, cache = tmp_path_factory.mktemp("moe"), {}

    def get(family: str) -> tuple[Any, Path]:
        if family not in cache:
            cfg = config_dict(family)
            torch.manual_seed(3)
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).eval()
            model.save_pretrained(root / family)
            cache[family] = model, root / family
        return cache[family]
    return get


def expected_shapes(cfg: Any, arch: str) -> dict[str, tuple[int, ...]]:
    """Every tensor's numpy shape (GGML's ne reversed), from the config alone."""
    import gguf

    h, e, layers = cfg.hidden_size, int(getattr(cfg, "num_local_experts", None) or cfg.num_experts), cfg.num_hidden_layers
    ff = int(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)
    d = int(getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads)
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shared = getattr(cfg, "shared_expert_intermediate_size", 0)
    per = {"attn_q": (q, h), "attn_k": (kv, h), "attn_v": (kv, h), "attn_q.bias": (q,), "attn_k.bias": (kv,),
           "attn_v.bias": (kv,), "attn_output": (h, q), "attn_q_norm": (d,), "attn_k_norm": (d,), "attn_norm": (h,),
           "ffn_norm": (h,), "ffn_gate_inp": (e, h), "ffn_gate_exps": (e, ff, h), "ffn_up_exps": (e, ff, h),
           "ffn_down_exps": (e, h, ff), "ffn_gate_shexp": (shared, h), "ffn_up_shexp": (shared, h),
           "ffn_down_shexp": (h, shared), "ffn_gate_inp_shexp": (h,)}
    out = {"token_embd.weight": (VOCAB, h), "output_norm.weight": (h,), "output.weight": (VOCAB, h)}
    for layer in range(layers):
        for name in LAYER[arch]:
            full = f"blk.{layer}.{name}" + ("" if name.endswith(".bias") else ".weight")
            out[full] = per[name]
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[getattr(gguf.MODEL_ARCH, arch.upper())]
               for i in range(layers)}
    assert {n.rsplit(".", 1)[0] for n in out} <= allowed, "the expected names are the arch's own"
    return out


def experts_of(model: Any, layer: int) -> dict[str, np.ndarray]:
    """The layer's stacked experts as llama.cpp stores them, split here from transformers' fused tensors."""
    experts = model.model.layers[layer].mlp.experts
    gate_up, down = experts.gate_up_proj.detach().float().numpy(), experts.down_proj.detach().float().numpy()
    half = gate_up.shape[1] // 2
    return {"ffn_gate_exps": gate_up[:, :half], "ffn_up_exps": gate_up[:, half:], "ffn_down_exps": down,
            "ffn_gate_inp": model.model.layers[layer].mlp.gate.weight.detach().float().numpy()}


@pytest.mark.parametrize("fmt", list(GGUF_TYPES))
@pytest.mark.parametrize("family", list(SHRUNK))
def test_moe_gguf_is_what_llama_cpp_converter_writes(family, fmt, models, tokenizer, tmp_path):
    import gguf

    from backend.export.gguf_check import read_back
    from backend.export.tensor_source import StateDictSource

    model, folder = models(family)
    cfg, arch = model.config, ARCH[family]
    memory = write(StateDictSource(model), tokenizer, fmt, tmp_path / "model.gguf")
    write(SafetensorsSource(folder), tokenizer, fmt, tmp_path / "disk" / "model.gguf")
    meta, tensors = fields(tmp_path / "model.gguf")
    _, from_disk = fields(tmp_path / "disk" / "model.gguf")
    types = tensors.pop("__types__")
    assert from_disk.pop("__types__") == types and memory.arch == arch == meta["general.architecture"]
    for name in tensors:  # the checkpoint's per-expert tensors and transformers' fused ones give one file
        assert np.array_equal(tensors[name], from_disk[name]), name

    shapes = expected_shapes(cfg, arch)
    assert {n: tensors[n].shape for n in tensors} == shapes
    quant = GGUF_TYPES[fmt]
    want_types = {n: "F32" if len(s) == 1 or ".ffn_gate_inp" in n else quant for n, s in shapes.items()}
    if quant in ("Q5_0", "Q4_0"):
        want_types["output.weight"] = "Q8_0"  # the head above 4/5 bits, as llama-quantize keeps it
    assert types == want_types

    experts = int(getattr(cfg, "num_local_experts", None) or cfg.num_experts)
    keys = {"expert_count": experts, "expert_used_count": cfg.num_experts_per_tok, "block_count": 2,
            "embedding_length": cfg.hidden_size, "context_length": cfg.max_position_embeddings,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads}
    if family != "mixtral":
        keys["expert_feed_forward_length"] = cfg.moe_intermediate_size
    if family == "qwen2_moe":
        keys["expert_shared_feed_forward_length"] = cfg.shared_expert_intermediate_size
    assert {k: meta.get(f"{arch}.{k}") for k in keys} == keys
    assert (f"{arch}.expert_shared_feed_forward_length" in meta) == (family == "qwen2_moe")

    for layer in range(2):
        for name, want in experts_of(model, layer).items():
            got = tensors[f"blk.{layer}.{name}.weight"]
            if types[f"blk.{layer}.{name}.weight"] == "F32":
                assert np.array_equal(got, want), name
            elif fmt == "gguf-f16":
                assert np.array_equal(got, want.astype(np.float16)), name
            else:  # blocks of 32 as gguf-py quantizes them
                qtype = getattr(gguf.GGMLQuantizationType, quant)
                q = gguf.quants.dequantize(gguf.quants.quantize(want, qtype), qtype).reshape(want.shape)
                assert np.array_equal(got, q), name
                if quant == "Q8_0":  # half a step of each block's scale, plus that fp16 scale's rounding
                    step = np.abs(want.reshape(-1, 32)).max(axis=1) / 127
                    assert (np.abs(got - want).reshape(-1, 32).max(axis=1) <= (0.5 + 127 * 2**-11) * step + 1e-7).all()
    if family == "qwen2_moe":
        mlp = model.model.layers[0].mlp
        assert np.array_equal(tensors["blk.0.ffn_gate_inp_shexp.weight"], mlp.shared_expert_gate.weight[0].detach().numpy())

    read, loaded, why = read_back(tmp_path / "model.gguf", cfg, "cpu")
    if CHECK[family] is None:
        assert why is None and type(read).__name__ == "Qwen3MoeForCausalLM"
        assert "float16 weights, float32 activations and products on cpu" in loaded
    else:
        assert read is None and CHECK[family] in why, why


def test_an_adapter_on_the_fused_experts_is_merged_into_the_gguf_experts(tokenizer, tmp_path):
    """peft's ParamWrapper on Qwen3-MoE's fused experts (lora_targets naming gate/up/down): the streaming
    merge writes peft's merge_and_unload into every expert of the F16 file, within one F16 rounding."""
    from backend.export.gguf_writer import GgufExport
    from tests.backend.test_export_merge import make_adapter, peft_merged, stream
    from tests.families import build_tiny_model

    base = build_tiny_model("qwen3_moe", tmp_path / "base", dtype="bfloat16")
    adapter = make_adapter(base, tmp_path / "adapter", targets=["q_proj", "gate_proj", "up_proj", "down_proj"])
    expected = peft_merged(base, adapter)
    source = stream(base, adapter, dtype=torch.float32, load_dtype=torch.bfloat16)
    assert any(".experts.3.up_proj." in name for name in source.adapter.modules)
    GgufExport(source, tokenizer, "gguf-f16", "tiny").write(tmp_path / "model.gguf")
    _, tensors = fields(tmp_path / "model.gguf")
    for layer in range(2):
        for kind in ("gate", "up", "down"):
            want = torch.stack([expected[f"model.layers.{layer}.mlp.experts.{e}.{kind}_proj.weight"] for e in range(4)])
            got = torch.from_numpy(tensors[f"blk.{layer}.ffn_{kind}_exps.weight"].astype(np.float32))
            step = torch.finfo(torch.float16).eps * want.abs().clamp(min=2**-14)
            assert ((got - want.to(torch.float16).float()).abs() <= step).all(), (layer, kind)
