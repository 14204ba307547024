"""GGUF export of every family in tests/families.py: written from a TensorSource, read back by code that is not ours.

Each tiny model (random weights, saved in bf16 or fp32) is written as F16 and Q8_0 (Q4_0 for two)
and checked three ways: the metadata keys llama.cpp reads, against values written out here by hand
from the tiny configs; the stored tensors, against the model's own tensors rearranged here
independently (permutation, Conv1D transpose, NeoX QKV order, Gemma's +1, stacked experts); and the
logits of transformers' own GGUF loader against the model. Where that loader cannot read a family,
or rebuilds a config attribute it has no key for, the check must say "not verified" and why;
`READABLE` lists the config overrides (the loader's defaults, which are real checkpoints' values)
under which it reads each family it can.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from backend.core.errors import JobError
from tests.families import BUNDLED, FAMILIES, build_tiny_model, tiny_config

torch.set_num_threads(1)
IDS = torch.tensor([[1, 4, 300, 517, 700, 911, 1200, 2, 5, 64, 128, 77, 99, 1000, 2000, 3000, 3500, 4095]])
READABLE: dict[str, dict[str, Any] | None] = {
    "llama": {}, "mistral": {}, "phi3": {}, "qwen2": {},
    "qwen3": dict(head_dim=128),  # its qwen3 mapping has no key_length: Qwen3Config's default 128
    "gemma2": dict(head_dim=256, query_pre_attn_scalar=256),  # no query_pre_attn_scalar key: default 256
    "gemma3_text": dict(head_dim=256, query_pre_attn_scalar=256, layer_types=["sliding_attention"] * 2),
    "gpt2": dict(n_inner=None, n_positions=1024),  # it maps context_length to n_ctx, ignores n_inner
    "qwen2_moe": dict(moe_intermediate_size=1408, shared_expert_intermediate_size=5632),  # no expert ffn keys
    "qwen3_moe": dict(moe_intermediate_size=768),
    "gpt_neox": None,  # no gptneox architecture
    "mixtral": None,  # reads the `llama` file as a dense Llama, experts dropped
}


class SafetensorsSource:
    """A TensorSource over a saved checkpoint's on-disk names (per-expert MoE tensors, no tied head)."""

    def __init__(self, folder: Path):
        from safetensors import safe_open
        from transformers import AutoConfig

        self.config = AutoConfig.from_pretrained(folder)
        self._file = safe_open(str(folder / "model.safetensors"), "pt")

    def names(self) -> list[str]:
        return list(self._file.keys())

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file.get_slice(name).get_shape())

    def get(self, name: str) -> torch.Tensor:
        return self._file.get_tensor(name)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(family, readable overrides or not) -> the saved tiny model's folder, built once."""
    root, cache = tmp_path_factory.mktemp("families"), {}

    def get(family: str, readable: bool = False) -> Path:
        key = (family, readable)
        if key not in cache:
            dtype = "bfloat16" if family in ("llama", "qwen2_moe", "gemma2") else "float32"
            cache[key] = build_tiny_model(family, root / f"{family}-{readable}", seed=1, dtype=dtype,
                                          **((READABLE[family] or {}) if readable else {}))
        return cache[key]
    return get


def load(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def write(source: Any, tokenizer: Any, fmt: str, path: Path) -> Any:
    from backend.export.gguf_writer import GgufExport

    export = GgufExport(source, tokenizer, fmt, "tiny")
    path.parent.mkdir(parents=True, exist_ok=True)
    export.write(path)
    return export


def fields(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
               for t in reader.tensors}
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    return meta, {**tensors, "__types__": types}  # type: ignore[dict-item]


# --- metadata keys, by hand from tests/families.py's configs ------------------------------------

DECODER = {"block_count": 2, "context_length": 512, "embedding_length": 64, "feed_forward_length": 128,
           "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6,
           "attention.key_length": 16, "attention.value_length": 16}
EXPECTED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {**DECODER, "rope.dimension_count": 16, "rope.freq_base": 10000.0, "vocab_size": 4096}),
    "mistral": ("llama", {**DECODER, "rope.dimension_count": 16, "vocab_size": 4096}),
    "mixtral": ("llama", {**DECODER, "expert_count": 4, "expert_used_count": 2, "rope.freq_base": 1e6,
                          "attention.layer_norm_rms_epsilon": 1e-5}),
    "qwen2": ("qwen2", {**DECODER, "rope.freq_base": 10000.0}),
    "qwen3": ("qwen3", DECODER),
    "qwen2_moe": ("qwen2moe", {**DECODER, "expert_count": 4, "expert_used_count": 2,
                               "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 64}),
    "qwen3_moe": ("qwen3moe", {**DECODER, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 32}),
    "gemma2": ("gemma2", {**DECODER, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                          "attention.sliding_window": 32}),
    "gemma3_text": ("gemma3", {**DECODER, "attention.sliding_window": 32, "rope.freq_base": 1e6,
                               "rope.freq_base_swa": 10000.0, "attention.sliding_window_pattern": [True, False]}),
    "phi3": ("phi3", {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128, "attention.head_count": 4,
                      "attention.head_count_kv": 2, "rope.dimension_count": 16, "attention.layer_norm_rms_epsilon": 1e-5,
                      "rope.scaling.original_context_length": 4096, "attention.sliding_window": 0}),
    "gpt2": ("gpt2", {"block_count": 2, "context_length": 512, "embedding_length": 64, "feed_forward_length": 128,
                      "attention.head_count": 4, "attention.layer_norm_epsilon": 1e-5}),
    "gpt_neox": ("gptneox", {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
                             "attention.head_count": 4, "rope.dimension_count": 4, "use_parallel_residual": True,
                             "attention.layer_norm_epsilon": 1e-5, "rope.freq_base": 10000.0}),
}


def _close(a: Any, b: Any) -> bool:
    if isinstance(b, float):
        return abs(float(a) - b) <= 1e-6 * max(1.0, abs(b))
    return list(a) == b if isinstance(b, list) else a == b


def _hf(state: dict[str, torch.Tensor], name: str) -> np.ndarray:
    return state[name].float().numpy()


def expected_tensors(family: str, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A few GGUF tensors of layer 0 computed here from the model's own tensors, independently of the writer."""
    p = "model.layers.0."
    if family in ("llama", "mistral", "mixtral"):
        q = _hf(state, p + "self_attn.q_proj.weight")  # rows (head, half, i) -> (head, i, half)
        out = {"blk.0.attn_q.weight": q.reshape(4, 2, 8, 64).transpose(0, 2, 1, 3).reshape(64, 64)}
        if family == "mixtral":
            for gguf_kind, hf_kind in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                out[f"blk.0.ffn_{gguf_kind}_exps.weight"] = np.stack(
                    [_hf(state, f"{p}block_sparse_moe.experts.{e}.{hf_kind}.weight") for e in range(4)])
        return out
    if family in ("qwen2_moe", "qwen3_moe"):
        out = {f"blk.0.ffn_{k}_exps.weight": np.stack([_hf(state, f"{p}mlp.experts.{e}.{k}_proj.weight")
                                                       for e in range(4)]) for k in ("gate", "up", "down")}
        out["blk.0.attn_q.weight"] = _hf(state, p + "self_attn.q_proj.weight")  # NeoX rotary: not permuted
        if family == "qwen2_moe":
            out["blk.0.ffn_gate_inp_shexp.weight"] = _hf(state, p + "mlp.shared_expert_gate.weight")[0]
        return out
    if family.startswith("gemma"):
        return {"blk.0.attn_norm.weight": _hf(state, p + "input_layernorm.weight") + 1,
                "output_norm.weight": _hf(state, "model.norm.weight") + 1}
    if family == "gpt2":
        return {"blk.0.attn_qkv.weight": _hf(state, "transformer.h.0.attn.c_attn.weight").T,
                "blk.0.ffn_down.weight": _hf(state, "transformer.h.0.mlp.c_proj.weight").T}
    if family == "gpt_neox":
        qkv = _hf(state, "gpt_neox.layers.0.attention.query_key_value.weight")  # (head, q|k|v, 16) rows
        bias = _hf(state, "gpt_neox.layers.0.attention.query_key_value.bias")
        order = [h * 48 + part * 16 + i for part in range(3) for h in range(4) for i in range(16)]
        return {"blk.0.attn_qkv.weight": qkv[order], "blk.0.attn_qkv.bias": bias[order],
                "output.weight": _hf(state, "embed_out.weight")}
    return {"blk.0.attn_qkv.weight": _hf(state, p + "self_attn.qkv_proj.weight")} if family == "phi3" else {}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_keys_and_tensors_follow_llama_cpp_layout_from_on_disk_and_in_memory_names(family, built, tokenizer, tmp_path):
    from backend.export.tensor_source import StateDictSource

    folder = built(family)
    disk = write(SafetensorsSource(folder), tokenizer, "gguf-f16", tmp_path / "disk.gguf")
    memory = write(StateDictSource(load(folder)), tokenizer, "gguf-f16", tmp_path / "memory.gguf")
    meta, tensors = fields(tmp_path / "disk.gguf")
    _, from_memory = fields(tmp_path / "memory.gguf")
    arch, keys = EXPECTED[family]
    assert meta["general.architecture"] == arch == disk.arch == memory.arch
    wrong = {k: (meta.get(f"{arch}.{k}"), v) for k, v in keys.items() if not _close(meta.get(f"{arch}.{k}"), v)}
    assert not wrong, wrong
    assert sorted(tensors) == sorted(from_memory)  # same tensors whichever names the source uses
    for name in tensors:
        if name != "__types__":
            assert np.array_equal(tensors[name], from_memory[name]), name
    from safetensors.torch import load_file

    for name, want in expected_tensors(family, load_file(folder / "model.safetensors")).items():
        assert tensors[name].shape == want.shape, name
        assert np.array_equal(tensors[name], want.astype(np.float16 if want.ndim > 1 else np.float32)), name
    types = tensors["__types__"]
    assert all(types[n] == "F32" for n in types if n.endswith("_norm.weight") or n.endswith(".bias"))
    assert ("output.weight" in types) == (family in ("mistral", "mixtral", "phi3", "gpt_neox", "qwen2_moe", "qwen3_moe"))


# --- read back by transformers' GGUF loader ------------------------------------------------------


def _compare(reference: Any, path: Path) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    read = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = reference(IDS).logits[0], read(IDS).logits[0]
    nll = lambda logits: torch.nn.functional.cross_entropy(logits[:-1], IDS[0, 1:]).item()  # noqa: E731
    return {"diff": (want - got).abs().max().item() / want.abs().max().item(),
            "top1": (want.argmax(-1) == got.argmax(-1)).float().mean().item(),
            "ppl": abs(np.exp(nll(got)) / np.exp(nll(want)) - 1)}


@pytest.mark.parametrize("family, fmt", [(f, fmt) for f, o in READABLE.items() if o is not None
                                         for fmt in ("gguf-f16", "gguf-q8_0")]
                         + [("llama", "gguf-q4_0"), ("qwen2_moe", "gguf-q4_0")])
def test_transformers_gguf_loader_reproduces_the_model(family, fmt, built, tokenizer, tmp_path):
    """F16: logits within fp16 rounding; Q8_0/Q4_0: close relative to the logit scale, same perplexity."""
    from backend.export.tensor_source import StateDictSource

    model = load(built(family, readable=True))
    write(StateDictSource(model), tokenizer, fmt, tmp_path / "model.gguf")
    figures = _compare(model, tmp_path / "model.gguf")
    bound = {"gguf-f16": (3e-3, 1.0, 1e-3), "gguf-q8_0": (3e-2, 0.9, 1e-2), "gguf-q4_0": (0.25, 0.6, 0.1)}[fmt]
    assert figures["diff"] <= bound[0] and figures["top1"] >= bound[1] and figures["ppl"] <= bound[2], figures


@pytest.mark.parametrize("family, reason", [
    ("gpt_neox", "no gptneox architecture"), ("mixtral", "dense Llama"),
    ("gemma2", "query_pre_attn_scalar=256 (the model has 16)"), ("qwen3", "failed on this file"),
])
def test_check_says_not_verified_and_why_where_transformers_cannot_read(family, reason, built, tokenizer, tmp_path):
    from backend.export.gguf_check import not_verified, read_back
    from backend.export.tensor_source import StateDictSource

    model = load(built(family))
    path = tmp_path / "model.gguf"
    write(StateDictSource(model), tokenizer, "gguf-q8_0", path)
    read, loaded, why = read_back(path, model.config, "cpu")
    assert read is None and loaded == "" and reason in why
    check = not_verified("perplexity", 0.05, why, path)
    assert check["verified"] is False and check["measured"].startswith("not verified: ")
    assert check["outcome"] == "not verified" and check["passed"] is False  # neither passed nor failed
    assert "llama_cpp_check.py" in check["how_to_verify"]


def test_check_reads_a_readable_family_back_in_the_precision_the_file_holds(built, tokenizer, tmp_path):
    """On the CPU an F16 file is read in fp16 weights (every F16 value exactly, never rounded to bf16), its
    activations in fp32 (experts widened while they run)."""
    from backend.export.gguf_check import read_back, tokenizer_check
    from backend.export.tensor_source import StateDictSource

    model = load(built("qwen2_moe", readable=True))
    path = tmp_path / "model.gguf"
    write(StateDictSource(model), tokenizer, "gguf-f16", path)
    read, loaded, why = read_back(path, model.config, "cpu")
    assert why is None and "Qwen2MoeForCausalLM, float16 weights, float32 activations and products on cpu" in loaded
    assert next(read.parameters()).dtype == torch.float16
    with torch.no_grad():
        want, got = model(IDS).logits[0], read(IDS).logits[0].float()
    assert (want - got).abs().max().item() <= 3e-3 * want.abs().max().item()
    check = tokenizer_check(path, tokenizer)
    assert check["passed"] and check["verified"]


# --- the text part of a multimodal Gemma 3, generated rotary tensors, refusals -------------------


def test_gemma3_multimodal_writes_its_text_model(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, Gemma3Config

    from backend.export.tensor_source import StateDictSource

    text = {k: v for k, v in FAMILIES["gemma3_text"].items() if k != "model_type"}
    text.update(READABLE["gemma3_text"])
    config = Gemma3Config(text_config=text, mm_tokens_per_image=4, vision_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    write(StateDictSource(model), tokenizer, "gguf-f16", tmp_path / "model.gguf")
    meta, tensors = fields(tmp_path / "model.gguf")
    assert meta["general.architecture"] == "gemma3" and not any("vision" in n or "mm_" in n for n in tensors)
    read = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="model.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (model(IDS).logits - read(IDS).logits).abs().max().item() < 3e-3


def test_llama3_and_longrope_scaling_write_llama_cpp_factor_tensors(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from backend.export.tensor_source import StateDictSource

    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=64)
    llama = AutoModelForCausalLM.from_config(tiny_config("llama", rope_parameters=rope))
    write(StateDictSource(llama), tokenizer, "gguf-f16", tmp_path / "llama3.gguf")
    _, tensors = fields(tmp_path / "llama3.gguf")
    freqs = 1.0 / 500000.0 ** (np.arange(0, 16, 2) / 16)
    wavelen = 2 * np.pi / freqs  # below 64/4 keep, above 64/1 divide by 8, between: smooth
    smooth = (64 / wavelen - 1) / 3
    want = np.where(wavelen < 16, 1.0, np.where(wavelen > 64, 8.0, 1 / ((1 - smooth) / 8 + smooth)))
    assert np.allclose(tensors["rope_freqs.weight"], want, rtol=1e-6)
    long, short = [1.0 + i / 8 for i in range(8)], [1.0] * 8
    phi = AutoModelForCausalLM.from_config(tiny_config("phi3", original_max_position_embeddings=128, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, long_factor=long, short_factor=short)))
    write(StateDictSource(phi), tokenizer, "gguf-f16", tmp_path / "phi.gguf")
    meta, tensors = fields(tmp_path / "phi.gguf")
    assert list(tensors["rope_factors_long.weight"]) == long and list(tensors["rope_factors_short.weight"]) == short
    assert meta["phi3.rope.scaling.type"] == "longrope" and meta["phi3.rope.scaling.original_context_length"] == 128
    assert abs(meta["phi3.rope.scaling.attn_factor"] - np.sqrt(1 + np.log(4) / np.log(128))) < 1e-6


@pytest.mark.parametrize("family, overrides, message", [
    ("qwen3_moe", dict(norm_topk_prob=False), "norm_topk_prob False (llama.cpp's qwen3moe always renormalizes"),
    ("qwen2_moe", dict(norm_topk_prob=True), "qwen2moe never renormalizes"),
    ("gemma2", dict(query_pre_attn_scalar=20), "query_pre_attn_scalar 20 (llama.cpp scales attention by 1/sqrt(16)"),
    ("llama", dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)), "rotary scaling dynamic"),
    ("llama", dict(hidden_act="gelu"), "hidden_act gelu"),
])
def test_what_llama_cpp_would_compute_differently_is_refused_in_one_line(family, overrides, message):
    from backend.export.gguf_writer import check_architecture

    with pytest.raises(JobError) as caught:
        check_architecture(tiny_config(family, **overrides))
    assert message in caught.value.message and "\n" not in caught.value.message and caught.value.hint
