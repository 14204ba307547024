"""The model families GGUF export writes: llama.cpp's architecture, hyper-parameters and quirks of each.

One `Family` per Hugging Face model_type, following llama.cpp's convert_hf_to_gguf.py (its
conversion/ classes): which architecture name the file carries (Mistral and Mixtral are `llama`),
whether Q/K rows are permuted to GGML's interleaved rotary layout (only the `llama` architecture:
the others use NeoX rotary), Gemma's `1 + w` RMSNorm folded into the stored norms, and the keys
llama.cpp reads. `problems` lists what llama.cpp would compute differently from transformers
(it hard-codes some choices), so such a model is refused instead of exported wrong.
`reader` says whether transformers' own GGUF loader can read the architecture back (the export's
check) and `forward_keys` which config attributes it must rebuild for that reading to be faithful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from backend.core.errors import bad_input
from backend.core.registries.export_formats import GGUF_ARCHITECTURES

COMMON_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "tie_word_embeddings",
               "hidden_act", "rope_parameters")
GEMMA_KEYS = ("query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping", "sliding_window",
              "layer_types", "hidden_activation")
MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")


def attr(cfg: Any, *names: str, default: Any = None) -> Any:
    """The first of `names` the config has (transformers renamed some across versions)."""
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def rope_of(cfg: Any, layer_kind: str = "full_attention") -> dict[str, Any]:
    """The rotary parameters of one kind of layer, with rope_type and rope_theta always present."""
    params = dict(attr(cfg, "rope_parameters", "rope_scaling", default={}) or {})
    if layer_kind in params or "full_attention" in params:
        params = dict(params.get(layer_kind) or params.get("full_attention") or {})
    params.setdefault("rope_type", params.get("type") or "default")
    if "rope_theta" not in params:
        params["rope_theta"] = attr(cfg, "rope_theta", "rotary_emb_base", default=10000.0)
    return params


def head_dim(cfg: Any) -> int:
    return int(attr(cfg, "head_dim", default=None) or cfg.hidden_size // cfg.num_attention_heads)


def kv_heads(cfg: Any) -> int:
    return int(attr(cfg, "num_key_value_heads", default=cfg.num_attention_heads))


def expert_count(cfg: Any) -> int:
    return int(attr(cfg, "num_local_experts", "num_experts", default=0))


# --- hyper-parameters, per family (the keys convert_hf_to_gguf.py writes) ----------------------


def _rope_keys(cfg: Any, w: Any, rope_dims: int | None = None) -> None:
    import gguf

    rope = rope_of(cfg)
    kind = rope["rope_type"]
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope.get("original_max_position_embeddings")
                                            or attr(cfg, "original_max_position_embeddings")))
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast), ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(float(rope[key]))
    elif kind == "longrope":
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    params = attr(cfg, "rope_parameters", default={}) or {}
    if isinstance(params.get("sliding_attention"), dict) and "rope_theta" in params["sliding_attention"]:
        w.add_rope_freq_base_swa(float(params["sliding_attention"]["rope_theta"]))
    if rope_dims is not None:
        w.add_rope_dimension_count(rope_dims)


def _decoder_keys(cfg: Any, w: Any) -> None:
    """TextModel.set_gguf_parameters: the keys every transformer decoder shares."""
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(kv_heads(cfg))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    if expert_count(cfg):
        w.add_expert_count(expert_count(cfg))
        w.add_expert_used_count(int(cfg.num_experts_per_tok))
    if attr(cfg, "moe_intermediate_size"):
        w.add_expert_feed_forward_length(int(cfg.moe_intermediate_size))
    if attr(cfg, "shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(int(cfg.shared_expert_intermediate_size))
    w.add_key_length(head_dim(cfg))
    w.add_value_length(head_dim(cfg))


def _llama_keys(cfg: Any, w: Any) -> None:
    _decoder_keys(cfg, w)
    w.add_vocab_size(cfg.vocab_size)
    _rope_keys(cfg, w, rope_dims=head_dim(cfg))


def _qwen_keys(cfg: Any, w: Any) -> None:
    _decoder_keys(cfg, w)
    _rope_keys(cfg, w)


def _qwen2vl_keys(cfg: Any, w: Any) -> None:
    """Qwen2VLModel: qwen2's keys plus M-RoPE's sections (time, height, width; padded to four)."""
    _qwen_keys(cfg, w)
    sections = list(rope_of(cfg).get("mrope_section") or [])
    w.add_rope_dimension_sections((sections + [0, 0, 0, 0])[:4])


def _qwen3vl_keys(cfg: Any, w: Any) -> None:
    """Qwen3VLTextModel: qwen3's keys plus M-RoPE's sections (llama.cpp's qwen3vl interleaves them itself)."""
    _qwen2vl_keys(cfg, w)


def _deepstack_keys(config: Any, w: Any) -> None:
    """The tower blocks whose features are added to the first language-model layers (Qwen3-VL's deepstack)."""
    vision = getattr(config, "vision_config", None)
    w.add_num_deepstack_layers(len(getattr(vision, "deepstack_visual_indexes", None) or []))


def _swa_pattern(cfg: Any, default_period: int) -> list[bool] | None:
    """Per-layer sliding flags when they differ from the period llama.cpp assumes, else None."""
    types = attr(cfg, "layer_types")
    if not types:
        return None
    flags = [t == "sliding_attention" for t in types]
    assumed = [(i % default_period) < default_period - 1 for i in range(len(flags))]
    return None if flags == assumed else flags


def _gemma2_keys(cfg: Any, w: Any) -> None:
    _decoder_keys(cfg, w)
    _rope_keys(cfg, w)
    if cfg.attn_logit_softcapping is not None:
        w.add_attn_logit_softcapping(float(cfg.attn_logit_softcapping))
    if cfg.final_logit_softcapping is not None:
        w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
    w.add_sliding_window(int(cfg.sliding_window))
    if (pattern := _swa_pattern(cfg, 2)) is not None:
        w.add_sliding_window_pattern(pattern)


def _gemma3_keys(cfg: Any, w: Any) -> None:
    _decoder_keys(cfg, w)
    _rope_keys(cfg, w)
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(float(cfg.final_logit_softcapping))
    if cfg.sliding_window and any(t == "sliding_attention" for t in (cfg.layer_types or ["sliding_attention"])):
        w.add_sliding_window(int(cfg.sliding_window))
        if (pattern := _swa_pattern(cfg, 6)) is not None:
            w.add_sliding_window_pattern(pattern)


def phi3_rope_dims(cfg: Any) -> int:
    return int(rope_of(cfg).get("partial_rotary_factor", 1.0) * cfg.hidden_size) // cfg.num_attention_heads


def phi3_original_context(cfg: Any) -> int:
    rope = rope_of(cfg)
    return int(rope.get("original_max_position_embeddings") or attr(cfg, "original_max_position_embeddings",
                                                                       default=cfg.max_position_embeddings))


def _phi3_keys(cfg: Any, w: Any) -> None:
    w.add_context_length(cfg.max_position_embeddings)
    w.add_rope_scaling_orig_ctx_len(phi3_original_context(cfg))
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(kv_heads(cfg))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    _rope_keys(cfg, w, rope_dims=phi3_rope_dims(cfg))
    w.add_sliding_window(int(cfg.sliding_window or 0))  # 0 tells llama.cpp this is Phi-4-like
    rope = rope_of(cfg)
    if rope["rope_type"] == "longrope":
        scale = cfg.max_position_embeddings / phi3_original_context(cfg)
        factor = rope.get("attention_factor")
        if factor is None:
            factor = math.sqrt(1 + math.log(scale) / math.log(phi3_original_context(cfg))) if scale > 1.0 else 1.0
        w.add_rope_scaling_attn_factors(float(factor))


def _gpt2_keys(cfg: Any, w: Any) -> None:
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(int(cfg.n_inner or 4 * cfg.n_embd))
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(float(cfg.layer_norm_epsilon))


def neox_rope_dims(cfg: Any) -> int:
    return int(rope_of(cfg).get("partial_rotary_factor", attr(cfg, "rotary_pct", default=1.0)) * head_dim(cfg))


def _neox_keys(cfg: Any, w: Any) -> None:
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_rope_dimension_count(neox_rope_dims(cfg))
    w.add_rope_freq_base(float(rope_of(cfg)["rope_theta"]))
    w.add_head_count(cfg.num_attention_heads)
    w.add_parallel_residual(bool(cfg.use_parallel_residual))
    w.add_layer_norm_eps(float(cfg.layer_norm_eps))


# --- what llama.cpp would compute differently (refused) ----------------------------------------


def _silu(cfg: Any) -> list[str]:
    act = attr(cfg, "hidden_act")
    return [] if act in (None, "silu", "swish") else [f"hidden_act {act} (llama.cpp computes SiLU for this architecture)"]


def _gemma_problems(cfg: Any, big_layers: int) -> list[str]:
    problems = []
    expected = cfg.hidden_size // cfg.num_attention_heads if cfg.num_hidden_layers == big_layers else head_dim(cfg)
    if cfg.query_pre_attn_scalar != expected:
        problems.append(f"query_pre_attn_scalar {cfg.query_pre_attn_scalar} (llama.cpp scales attention by "
                        f"1/sqrt({expected}) for a {cfg.num_hidden_layers}-layer model)")
    act = attr(cfg, "hidden_activation", "hidden_act")
    if act not in ("gelu_pytorch_tanh", "gelu_new", "gelu"):
        problems.append(f"hidden_activation {act} (llama.cpp computes tanh GELU)")
    return problems


def _gemma3_problems(cfg: Any) -> list[str]:
    problems = _gemma_problems(cfg, 62)
    if cfg.attn_logit_softcapping is not None:
        problems.append("attn_logit_softcapping (llama.cpp's gemma3 has none)")
    return problems


def _qwen_moe_problems(cfg: Any, normalized: bool) -> list[str]:
    problems = _silu(cfg)
    if bool(attr(cfg, "norm_topk_prob", default=False)) != normalized:
        problems.append(f"norm_topk_prob {attr(cfg, 'norm_topk_prob')} (llama.cpp's {'qwen3moe' if normalized else 'qwen2moe'} "
                        f"{'always' if normalized else 'never'} renormalizes the chosen experts' weights)")
    if int(attr(cfg, "decoder_sparse_step", default=1)) != 1 or attr(cfg, "mlp_only_layers"):
        problems.append("dense layers between the expert layers (decoder_sparse_step/mlp_only_layers; llama.cpp "
                        "expects experts in every layer)")
    return problems


def _qwen2_problems(cfg: Any) -> list[str]:
    problems = _silu(cfg)
    if attr(cfg, "use_sliding_window", default=False):
        problems.append("use_sliding_window (llama.cpp's qwen2 has no sliding window)")
    return problems


def _neox_problems(cfg: Any) -> list[str]:
    act = attr(cfg, "hidden_act")
    return [] if act in ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh") else [
        f"hidden_act {act} (llama.cpp's gptneox computes GELU)"]


def _gpt2_problems(cfg: Any) -> list[str]:
    problems = []
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) or not getattr(cfg, "scale_attn_weights", True):
        problems.append("a non-standard attention scaling (scale_attn_by_inverse_layer_idx/scale_attn_weights)")
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh", "gelu", "gelu_fast"):
        problems.append(f"activation_function {cfg.activation_function} (llama.cpp computes GELU)")
    return problems


# --- the table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    arch: str  # gguf.MODEL_ARCH member
    hparams: Callable[[Any, Any], None]
    permute_qk: bool = False  # llama's rotary pairs (i, i+d/2) -> GGML's (2i, 2i+1)
    norm_shift: float = 0.0  # added to every *norm.weight (Gemma's RMSNorm computes x * (1 + w))
    problems: Callable[[Any], list[str]] = _silu
    rope_types: tuple[str, ...] = ("default", "linear", "yarn")
    reader: str | None = None  # None: transformers' GGUF loader reads it; else why it cannot
    forward_keys: tuple[str, ...] = COMMON_KEYS
    whole_config_keys: Callable[[Any, Any], None] | None = None  # keys read off the whole (image-text) config
    output_required: bool = False  # llama.cpp has no fallback to token_embd for the output head
    no_output: bool = False  # llama.cpp always uses token_embd as the output head

    @property
    def name(self) -> str:
        import gguf

        return gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, self.arch)]


_LLAMA = Family("LLAMA", _llama_keys, permute_qk=True, rope_types=("default", "linear", "yarn", "llama3"))
_MOE_NOTE = ("transformers reads a `llama` GGUF as a dense Llama: it has no Mixtral mapping for the "
             "ffn_*_exps expert tensors")
GGUF_FAMILIES: dict[str, Family] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": Family("LLAMA", _llama_keys, permute_qk=True, reader=_MOE_NOTE,
                      rope_types=("default", "linear", "yarn", "llama3")),
    "qwen2": Family("QWEN2", _qwen_keys, problems=_qwen2_problems),
    "qwen3": Family("QWEN3", _qwen_keys),
    "qwen2_moe": Family("QWEN2MOE", _qwen_keys, problems=lambda c: _qwen_moe_problems(c, False),
                        forward_keys=COMMON_KEYS + MOE_KEYS, output_required=True),
    "qwen3_moe": Family("QWEN3MOE", _qwen_keys, problems=lambda c: _qwen_moe_problems(c, True),
                        forward_keys=COMMON_KEYS + MOE_KEYS),
    "gemma2": Family("GEMMA2", _gemma2_keys, norm_shift=1.0, problems=lambda c: _gemma_problems(c, 46),
                     forward_keys=COMMON_KEYS[:-2] + GEMMA_KEYS + ("rope_parameters",), no_output=True),
    "gemma3_text": Family("GEMMA3", _gemma3_keys, norm_shift=1.0, problems=_gemma3_problems,
                          forward_keys=COMMON_KEYS[:-2] + GEMMA_KEYS + ("rope_parameters",)),
    "phi3": Family("PHI3", _phi3_keys, rope_types=("default", "longrope"),
                   forward_keys=COMMON_KEYS + ("original_max_position_embeddings",)),
    "gpt2": Family("GPT2", _gpt2_keys, problems=_gpt2_problems, rope_types=("default",),
                   forward_keys=("n_embd", "n_layer", "n_head", "n_inner", "n_positions", "layer_norm_epsilon",
                                 "activation_function", "vocab_size", "tie_word_embeddings")),
    "gpt_neox": Family("GPTNEOX", _neox_keys, problems=_neox_problems, rope_types=("default",),
                       reader="transformers' GGUF loader has no gptneox architecture", output_required=True),
}
GGUF_FAMILIES["gemma3"] = GGUF_FAMILIES["gemma3_text"]  # the text part of the multimodal Gemma 3 (its text_config)
# The language model of a vision-language run, beside its mmproj file (gguf_mmproj.py): Qwen2.5-VL's is
# written as llama.cpp's qwen2vl (M-RoPE), Qwen3-VL's as qwen3vl (M-RoPE, deepstack), SmolVLM's / Idefics3's (a
# Llama text_config) as llama.
GGUF_FAMILIES["qwen2_5_vl"] = Family("QWEN2VL", _qwen2vl_keys, problems=_qwen2_problems,
                                     reader="transformers' GGUF loader has no qwen2vl architecture")
GGUF_FAMILIES["qwen3_vl"] = Family("QWEN3VL", _qwen3vl_keys, whole_config_keys=_deepstack_keys,
                                   reader="transformers' GGUF loader has no qwen3vl architecture")
GGUF_FAMILIES["idefics3"] = GGUF_FAMILIES["smolvlm"] = _LLAMA
assert set(GGUF_FAMILIES) == set(GGUF_ARCHITECTURES), "formats.GGUF_ARCHITECTURES and GGUF_FAMILIES must agree"


def text_config(config: Any) -> Any:
    """The decoder's config: a multimodal model's text_config (Gemma 3), else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def family_of(config: Any) -> tuple[Family, Any]:
    """The family and the decoder config for this model, or a one-line refusal."""
    model_type = getattr(config, "model_type", None)
    if model_type not in GGUF_FAMILIES:
        written = ", ".join(sorted({f"{k} (as {v})" if k != v else k for k, v in GGUF_ARCHITECTURES.items()}))
        raise bad_input(f"GGUF export writes the families {written}; this model is {model_type}",
                        "export merged, bnb-8bit or bnb-4bit instead")
    family, cfg = GGUF_FAMILIES[model_type], text_config(config)
    kind = rope_of(cfg)["rope_type"]
    problems = list(family.problems(cfg))
    if kind not in family.rope_types:
        problems.insert(0, f"rotary scaling {kind} (written for {family.name}: {', '.join(family.rope_types)})")
    if problems:
        raise bad_input(f"GGUF export of this {model_type} model would not compute what it computes in "
                        f"transformers: {'; '.join(problems)}", "export merged, bnb-8bit or bnb-4bit instead")
    return family, cfg
