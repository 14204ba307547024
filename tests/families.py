"""Tiny random-weight models of every family the studio supports, built from their config classes.

Never downloaded: each family is a config dict small enough to train on the CPU in a test, with the
family's own quirks switched on (Gemma's soft-capping and sliding windows, Qwen3's q/k norms,
GPT-NeoX's partial rotary, MoE routing with shared experts). Every model gets the bundled model's
tokenizer and chat template (vocabulary 4096), so data, templates and exports work unchanged.
Tests, benchmarks and scripts import this module; it imports torch and transformers only when a
model is built.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "resources" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
VOCAB = 4096
SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}

_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=512, vocab_size=VOCAB, **SPECIAL)

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_DECODER, tie_word_embeddings=True),
    "mistral": dict(model_type="mistral", **_DECODER, sliding_window=None, tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", **_DECODER, tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", **_DECODER, tie_word_embeddings=True),
    "gemma2": dict(model_type="gemma2", **_DECODER, query_pre_attn_scalar=16, sliding_window=32,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3_text": dict(model_type="gemma3_text", **_DECODER, query_pre_attn_scalar=16, sliding_window=32,
                        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh"),
    "phi3": dict(model_type="phi3", **{k: v for k, v in _DECODER.items() if k != "head_dim"},
                 tie_word_embeddings=False),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=512, n_inner=128,
                 vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, rotary_pct=0.25, max_position_embeddings=512, vocab_size=VOCAB,
                     tie_word_embeddings=False, use_parallel_residual=True, **SPECIAL),
    "qwen2_moe": dict(model_type="qwen2_moe", **_DECODER, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=64, decoder_sparse_step=1,
                      tie_word_embeddings=False),
    "qwen3_moe": dict(model_type="qwen3_moe", **_DECODER, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                      moe_intermediate_size=32, decoder_sparse_step=1, tie_word_embeddings=False),
    "mixtral": dict(model_type="mixtral", **_DECODER, num_local_experts=4, num_experts_per_tok=2,
                    tie_word_embeddings=False),
}
"""Family name (config.json's model_type) -> the config.json of a tiny model of it."""

MOE = ("qwen2_moe", "qwen3_moe", "mixtral")


def tiny_config(family: str, **overrides: Any) -> Any:
    """The transformers config object of `family`'s tiny model (extra keys override the table)."""
    from transformers import AutoConfig

    raw = {**FAMILIES[family], **overrides}
    model_type = raw.pop("model_type")
    return AutoConfig.for_model(model_type, **raw)


def build_tiny_model(family: str, folder: Path, *, seed: int = 0, dtype: str = "float32",
                     **overrides: Any) -> Path:
    """Write a random-weight `family` model (safetensors), the bundled tokenizer and chat template
    into `folder`; the same seed gives the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (BUNDLED / name).is_file():
            shutil.copy(BUNDLED / name, folder / name)
    return folder
