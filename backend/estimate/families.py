"""config.json -> (Arch, Dims): each family read in its own key names, with its config class's defaults.

A key config.json leaves out takes the default of the family's transformers config class (what
transformers itself would build); tests/backend/test_estimate_families.py checks these defaults
against the classes. Any key that is there but unusable (a string, zero, negative) is a one-line
ValueError naming the file, the key and the fix: never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backend.estimate.architectures import (
    GEMMA2, GEMMA3, GPT2, GPT_NEOX, LLAMA, MIXTRAL, PHI3, QWEN2, QWEN2_MOE, QWEN3, QWEN3_5, QWEN3_MOE, Arch, Dims,
)
from backend.core.paths import not_downloaded, resolve_resource

_COMMON = {"tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
           "attention_dropout": 0.0}
_GEMMA = {**_COMMON, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh", "head_dim": 256,
          "query_pre_attn_scalar": 256}
_MOE = {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": False, "output_router_logits": False}

ESTIMATE_FAMILIES: dict[str, tuple[Arch, dict[str, Any]]] = {
    "llama": (LLAMA, {**_COMMON, "intermediate_size": 11008}),
    "mistral": (LLAMA, {**_COMMON, "intermediate_size": 14336, "sliding_window": 4096}),
    "qwen2": (QWEN2, {**_COMMON, "intermediate_size": 22016}),
    "qwen3": (QWEN3, {**_COMMON, "intermediate_size": 22016, "head_dim": 128}),
    "gemma2": (GEMMA2, {**_GEMMA, "intermediate_size": 9216, "final_logit_softcapping": 30.0,
                        "attn_logit_softcapping": 50.0, "sliding_window_pattern": 2}),
    "gemma3_text": (GEMMA3, {**_GEMMA, "intermediate_size": 9216, "final_logit_softcapping": None,
                             "attn_logit_softcapping": None, "sliding_window_pattern": 6}),
    "phi3": (PHI3, {**_COMMON, "intermediate_size": 8192, "resid_pdrop": 0.0, "embd_pdrop": 0.0}),
    "gpt2": (GPT2, {"tie_word_embeddings": True, "activation_function": "gelu_new", "n_inner": None,
                    "n_positions": 1024, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}),
    "gpt_neox": (GPT_NEOX, {**_COMMON, "intermediate_size": 24576, "hidden_act": "gelu", "attention_bias": True,
                            "use_parallel_residual": True, "rotary_pct": 0.25, "hidden_dropout": 0.0}),
    "qwen2_moe": (QWEN2_MOE, {**_COMMON, **_MOE, "intermediate_size": 5632, "moe_intermediate_size": 1408,
                              "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
                              "qkv_bias": True}),
    "qwen3_moe": (QWEN3_MOE, {**_COMMON, **_MOE, "intermediate_size": 6144, "moe_intermediate_size": 768,
                              "num_experts": 128, "num_experts_per_tok": 8}),
    "mixtral": (MIXTRAL, {**_COMMON, "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
                          "output_router_logits": False, "router_jitter_noise": 0.0}),
    "qwen3_5_text": (QWEN3_5, {**_COMMON, "intermediate_size": 12288, "head_dim": 256, "partial_rotary_factor": 0.25,
                               "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                               "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4}),
}
"""config.json's model_type -> (Arch, the config class's defaults for keys config.json may leave out).
Mistral, SmolLM and TinyLlama are Llama-style (SmolLM and TinyLlama say model_type llama). Qwen3.5's
MoE decoder (qwen3_5_moe_text) is not here: it is estimated as a Llama-style decoder, with a warning."""

_DIMENSIONS = ("vocab_size", "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
for _type, _values in {
    "llama": (32000, 32, 32, 2048), "mistral": (32000, 32, 8, 131072), "qwen2": (151936, 32, 32, 32768),
    "qwen3": (151936, 32, 32, 32768), "gemma2": (256000, 8, 4, 8192), "gemma3_text": (262208, 8, 4, 131072),
    "phi3": (32064, 32, 32, 4096), "gpt_neox": (50432, 64, None, 2048), "qwen2_moe": (151936, 16, 16, 32768),
    "qwen3_moe": (151936, 32, 4, 32768), "mixtral": (32000, 32, 8, 131072), "qwen3_5_text": (248320, 16, 4, 32768),
}.items():
    # Heads and vocabulary too: a published config.json may leave them to the class (gemma-3-4b-it's
    # names neither). hidden_size and num_hidden_layers have no default here: a file without them is
    # broken, not brief, and a class default would estimate some other model without a word.
    ESTIMATE_FAMILIES[_type][1].update({k: v for k, v in zip(_DIMENSIONS, _values) if v is not None})
ESTIMATE_FAMILIES["gpt2"][1].update(vocab_size=50257, n_head=12)
_NESTED_SIZES = {"llama": {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008}}
"""LlamaConfig's sizes, which a vision-language model's text_config may leave to the class (unlike a text
model's own config.json, where a missing width is a broken file)."""
VLM_TEXT = {"qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2", "qwen3_vl_text": "qwen3"}
"""A vision-language model's language model that is a text family's decoder (M-RoPE aside, which holds
no memory of its own): Qwen2.5-VL's is Qwen2's, Qwen3-VL's Qwen3's."""
_VLM_DEFAULTS = {"qwen2": {"intermediate_size": 29568, "vocab_size": 152064, "num_attention_heads": 64,
                           "num_key_value_heads": 8}, "qwen3": {"max_position_embeddings": 128000}}
"""Where the VLM's text config class's defaults differ from the text family's (Qwen2_5_VLTextConfig's are 72B's)."""
for _type, _text in VLM_TEXT.items():
    _arch, _defaults = ESTIMATE_FAMILIES[_text]
    ESTIMATE_FAMILIES[_type] = (_arch, {**_defaults, **_VLM_DEFAULTS[_text]})

ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
             "num_hidden_layers": "n_layer"},
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "mixtral": {"num_experts": "num_local_experts"},
}
"""Each family's config class's `attribute_map` (transformers 5.25; the families not named have
none): the key a file may store a value under instead of the attribute's own name, e.g.
transformers 5's save_pretrained writes Qwen3-MoE's expert count as num_local_experts.
tests/backend/test_estimate_keys.py compares this table with the classes so it cannot drift."""

_OWN_KEYS: dict[str, dict[str, str]] = {
    "gpt2": {"intermediate_size": "n_inner", "hidden_act": "activation_function"},
}
"""Keys a family names in its own way beyond the attribute_map (read here under the common name)."""
_FIX = "copy config.json unchanged from the model's Hugging Face repository"


def load_model_config(model_config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """config.json as a dict, from a dict, a folder holding config.json, the file, or `bundled:NAME`.
    The dict gets the file's path under "_source" (for error messages)."""
    if isinstance(model_config, dict):
        return model_config
    text = str(model_config)
    missing = not_downloaded(text)
    if missing:
        raise ValueError(missing)
    path = resolve_resource(text)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no config.json; point model.path at a Hugging Face model folder") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not config.json; point model.path at the model folder") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text; {_FIX}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); {_FIX}") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror}); check the file's permissions") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}; {_FIX}")
    return {**raw, "_source": str(path)}


class _Reader:
    """Values of one config dict, in the family's key names, with its defaults and one-line errors."""

    def __init__(self, raw: dict[str, Any], defaults: dict[str, Any], aliases: dict[str, str], source: str) -> None:
        self.raw, self.defaults, self.aliases, self.source = raw, defaults, aliases, source
        self.defaulted: dict[str, Any] = {}
        """Dimensions config.json leaves out, filled from the config class's defaults (said in a note)."""

    def key(self, name: str) -> str:
        """The key config.json holds `name` under: the alias when the file uses it (or uses neither)."""
        alias = self.aliases.get(name)
        return alias if alias and (alias in self.raw or name not in self.raw) else name

    def get(self, name: str, default: Any = None) -> Any:
        key = self.key(name)
        if key in self.raw:
            return self.raw[key]
        return self.defaults.get(key, self.defaults.get(name, default))

    def dimension(self, name: str, default: Any = None) -> Any:
        """A size of the model: a class default filling it is recorded, for the estimate's note."""
        key = self.key(name)
        if key not in self.raw and (key in self.defaults or name in self.defaults):
            self.defaulted[key] = self.defaults.get(key, self.defaults.get(name))
        return self.get(name, default)

    def _bad(self, name: str, value: Any, what: str) -> ValueError:
        shown = "missing" if value is None else f"{value!r}"
        return ValueError(f"{self.source}: {self.key(name)} is {shown}, not {what}; {_FIX}")

    def positive(self, name: str, default: Any = None, size: bool = True) -> int:
        """A positive integer; `size` False for a schedule (a layer pattern), not a size of the model."""
        value = self.dimension(name, default) if size else self.get(name, default)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self._bad(name, value, "a positive integer")
        return value

    def fraction(self, name: str, default: float = 0.0) -> float:
        value = self.get(name, default)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise self._bad(name, value, "a number from 0 to 1")
        return float(value)

    def cap(self, name: str) -> float | None:
        value = self.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self._bad(name, value, "a positive number or null")
        return float(value)

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(name, value, "true or false")
        return value


def text_part(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The text decoder's config and, for a multimodal config, the whole one (its text_config nests
    the decoder: Gemma 3's model_type gemma3 holds a gemma3_text)."""
    source = str(raw.get("_source", "config.json"))
    text = raw.get("text_config")
    if isinstance(text, dict):
        model_type = text.get("model_type") or f"{raw.get('model_type', '')}_text"
        tied = {"tie_word_embeddings": raw["tie_word_embeddings"]} if "tie_word_embeddings" in raw else {}
        # A nested text_config is built from its class's defaults (LLaVA-1.5's names neither width nor depth)
        sizes = {k: v for k, v in _NESTED_SIZES.get(str(model_type), {}).items() if k not in text}
        return {**tied, **sizes, **text, "model_type": model_type, "_source": source}, raw
    if text is not None:
        raise ValueError(f"{source}: text_config is {type(text).__name__}, not an object; {_FIX}")
    towers = [k for k in raw if k.endswith(("vision_config", "audio_config")) and isinstance(raw[k], dict)]
    if towers and not any(k in raw for k in ("hidden_size", "n_embd", "d_model")):
        raise ValueError(f"{source}: a multimodal config ({', '.join(towers)}) without text_config; "
                         "point model.path at a model with a text decoder")
    return raw, (raw if towers else None)


def read_dims(raw: dict[str, Any]) -> tuple[Arch, Dims, list[str]]:
    """The architecture family and numbers of a config.json dict, plus warnings (one line each)."""
    if not isinstance(raw, dict):
        raise ValueError(f"config.json: expected a JSON object, got {type(raw).__name__}; {_FIX}")
    warnings: list[str] = []
    raw, outer = text_part(raw)
    source = str(raw.get("_source", "config.json"))
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"{source}: model_type is {model_type!r}, not a string; {_FIX}")
    family = ESTIMATE_FAMILIES.get(model_type or "")
    if family is None:
        arch, defaults = LLAMA, dict(_COMMON)
        experts = next((raw[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if raw.get(k)), None)
        warnings.append(f"model_type {model_type!r} is not in the table, so not measured: estimated as a Llama-style "
                        "decoder (RMSNorm, rotary, SiLU-gated MLP, no biases) from its hidden, intermediate, layer "
                        "and head counts" + (f", without its {experts} experts" if experts else ""))
    else:
        arch, defaults = family
    aliases = {**ATTRIBUTE_MAPS.get(str(model_type), {}), **_OWN_KEYS.get(arch.family, {})}
    r = _Reader(raw, defaults, aliases, source)
    hidden = r.positive("hidden_size")
    heads = r.positive("num_attention_heads")
    layers = r.positive("num_hidden_layers")
    vocab = r.positive("vocab_size")
    # GPT-2's n_inner null means 4 x hidden; so does a missing intermediate_size outside the table.
    intermediate = r.positive("intermediate_size") if r.get("intermediate_size") is not None or (
        family is not None and arch.family != "gpt2") else 4 * hidden
    kv_heads = r.positive("num_key_value_heads", heads) if r.get("num_key_value_heads") is not None else heads
    head_dim = r.positive("head_dim") if r.get("head_dim") is not None else hidden // heads
    if heads % kv_heads:
        raise ValueError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}; {_FIX}")
    rope = r.get("rope_parameters") or r.get("rope_scaling") or {}
    factor = r.get("rotary_pct", r.get("partial_rotary_factor"))
    if factor is None and isinstance(rope, dict):
        factor = rope.get("partial_rotary_factor")
    rotary_dim = 0 if arch.learned_positions else int(head_dim * (1.0 if factor is None else float(factor)))
    act = r.get("hidden_activation") if arch.family in ("gemma2", "gemma3_text") else None
    act = str(act or r.get("hidden_act") or ("silu" if arch.gated_mlp else "gelu"))
    qkv_bias = o_bias = r.flag("attention_bias", arch.qkv_bias)
    mlp_bias = r.flag("mlp_bias", arch.mlp_bias)
    if arch.family in ("qwen2", "qwen2_moe"):
        qkv_bias, o_bias, mlp_bias = r.flag("qkv_bias", True) if arch.family == "qwen2_moe" else True, False, False
    elif arch.family == "gpt_neox":
        mlp_bias = True
    elif arch.family == "gpt2":
        qkv_bias = o_bias = mlp_bias = True
    dims: dict[str, Any] = dict(
        model_type=str(model_type or "llama"), hidden=hidden, intermediate=intermediate, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tied=r.flag("tie_word_embeddings"), rotary_dim=rotary_dim,
        parallel_residual=r.flag("use_parallel_residual", True) if arch.family == "gpt_neox" else arch.parallel_residual,
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias, act=act,
    )
    if arch.family == "gpt2":
        dims.update(positions=r.positive("max_position_embeddings"), attn_dropout=r.fraction("attn_pdrop"),
                    resid_dropout=r.fraction("resid_pdrop"), embd_dropout=r.fraction("embd_pdrop"))
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if r.flag(flag):
                warnings.append(f"gpt2 {flag}: true is not modelled; estimated as GPT-2's default attention")
    else:
        # Phi-3 drops out the attention and MLP outputs (resid_pdrop); its embd_pdrop is unused there.
        dims.update(attn_dropout=r.fraction("attention_dropout"),
                    resid_dropout=r.fraction("resid_pdrop") if arch.family == "phi3" else 0.0)
    if arch.family == "gpt_neox" and r.fraction("hidden_dropout"):
        dims["resid_dropout"] = r.fraction("hidden_dropout")
    if arch.family in ("gemma2", "gemma3_text"):
        dims.update(attn_softcap=r.cap("attn_logit_softcapping"), final_softcap=r.cap("final_logit_softcapping"))
    dims.update(_windows(arch, str(model_type), r, layers))
    if arch.moe:
        dims.update(_moe_dims(arch, r, layers))
    if arch.family == "qwen3_5_text":
        dims.update(_linear_attention_dims(r, layers))
    if outer is not None:
        from backend.estimate.towers import tower_params

        extra, extra_linear, linears, more = tower_params(outer)
        dims.update(extra_params=extra, extra_linear_params=extra_linear, extra_linears=linears)
        warnings += more
    if r.defaulted and family is not None:
        given = ", ".join(f"{k} {v}" for k, v in sorted(r.defaulted.items()))
        warnings.append(f"{source} leaves {given} to {model_type}'s defaults, as transformers does")
    if act in ("gelu_fast", "quick_gelu") or (act not in ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "relu")):
        warnings.append(f"hidden_act {act}: estimated as one saved input per activation, like SiLU")
    return arch, Dims(**dims), warnings


def _windows(arch: Arch, model_type: str, r: _Reader, layers: int) -> dict[str, Any]:
    """sliding_window and layer_types as each config class resolves them (they decide where SDPA
    gets a 4-D mask): Gemma alternates by sliding_window_pattern, Qwen windows only with
    use_sliding_window (from max_window_layers on), Mistral / Phi-3 / Mixtral window every layer;
    Llama, GPT-2 and GPT-NeoX have no windows."""
    family = "mistral" if model_type == "mistral" else arch.family
    if family not in ("mistral", "phi3", "mixtral") and not family.startswith(("qwen", "gemma")):
        return {}
    if family.startswith("qwen") and not r.flag("use_sliding_window"):
        return {}
    window = r.get("sliding_window", 4096 if family.startswith(("gemma", "qwen")) else None)
    if window is None or window == 0:
        return {}
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise r._bad("sliding_window", window, "a positive integer or null")
    types = r.get("layer_types")
    if isinstance(types, list) and len(types) == layers and all(isinstance(t, str) for t in types):
        return {"sliding_window": window, "layer_types": tuple(types)}
    if types is not None:
        raise r._bad("layer_types", types, f"a list of {layers} layer types")
    if family.startswith("gemma"):
        pattern = r.positive("sliding_window_pattern", size=False)
        kinds = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    elif family.startswith("qwen"):
        first = r.get("max_window_layers", 28)
        first = first if isinstance(first, int) else 28
        if family == "qwen2_moe":
            kinds = ["sliding_attention" if (i + 1) % 2 and i < first else "full_attention" for i in range(layers)]
        else:
            kinds = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    else:
        kinds = ["sliding_attention"] * layers
    return {"sliding_window": window, "layer_types": tuple(kinds)}


def _linear_attention_dims(r: _Reader, layers: int) -> dict[str, Any]:
    """Qwen3.5's layer pattern (layer_types, else every full_attention_interval-th layer full, as
    Qwen3_5TextConfig builds it) and its Gated DeltaNet widths."""
    types = r.get("layer_types")
    if types is None:
        interval = r.positive("full_attention_interval", size=False)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if (not isinstance(types, list) or len(types) != layers
            or not all(t in ("linear_attention", "full_attention") for t in types)):
        raise r._bad("layer_types", types, f"a list of {layers} 'linear_attention' / 'full_attention'")
    return dict(layer_types=tuple(types), linear_k_heads=r.positive("linear_num_key_heads"),
                linear_v_heads=r.positive("linear_num_value_heads"), linear_k_dim=r.positive("linear_key_head_dim"),
                linear_v_dim=r.positive("linear_value_head_dim"), conv_kernel=r.positive("linear_conv_kernel_dim"))


def _moe_dims(arch: Arch, r: _Reader, layers: int) -> dict[str, Any]:
    experts = r.positive("num_experts")  # num_local_experts where the class's attribute_map says so
    top_k = r.positive("num_experts_per_tok")
    if top_k > experts:
        raise ValueError(f"{r.source}: num_experts_per_tok {top_k} is more than the {experts} experts; {_FIX}")
    if arch.moe == "mixtral":
        sparse = (True,) * layers
        expert_inter = r.positive("intermediate_size")
    else:
        step = r.positive("decoder_sparse_step", size=False)
        dense = r.get("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) for i in dense):
            raise r._bad("mlp_only_layers", dense, "a list of layer indices")
        sparse = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
        expert_inter = r.positive("moe_intermediate_size")
    out = dict(experts=experts, top_k=top_k, expert_intermediate=expert_inter, sparse_layers=sparse,
               norm_topk=arch.moe == "mixtral" or r.flag("norm_topk_prob"), router_aux_loss=r.flag("output_router_logits"),
               router_jitter=arch.moe == "mixtral" and r.fraction("router_jitter_noise") > 0)
    if arch.shared_expert:
        out["shared_intermediate"] = r.positive("shared_expert_intermediate_size")
    return out


def max_positions(raw: dict[str, Any]) -> int | None:
    """The longest sequence the model's positions cover (max_position_embeddings, GPT-2's n_positions),
    read through the same aliases and defaults as read_dims; None when neither file nor class says."""
    text, _ = text_part(raw)
    arch, defaults = ESTIMATE_FAMILIES.get(str(text.get("model_type") or ""), (LLAMA, dict(_COMMON)))
    aliases = {**ATTRIBUTE_MAPS.get(str(text.get("model_type")), {}), **_OWN_KEYS.get(arch.family, {})}
    value = _Reader(text, defaults, aliases, str(text.get("_source", "config.json"))).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
