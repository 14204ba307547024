"""Reading a written GGUF back the way a runtime would, without llama.cpp: the export's own check.

`load_llama` rebuilds the model from the file alone: hyperparameters from the GGUF metadata, every
tensor dequantized with gguf.quants.dequantize, Q and K un-permuted to the Hugging Face rotary
layout, loaded into a transformers LlamaForCausalLM in fp32. A wrong key, shape, permutation or
quantization shows up as logits or perplexity that no longer match the trained model.
`tokenizer_check` compares the tokenizer metadata with the run's tokenizer and re-tokenizes the
fixed prompts with a BPE built from the file's tokens and merges alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.export.gguf_writer import unpermute


def read_fields(reader: Any) -> dict[str, Any]:
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one we need
            continue
    return out


def load_llama(path: Path) -> tuple[Any, dict[str, Any]]:
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    reader = gguf.GGUFReader(path)
    meta = read_fields(reader)
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch}, expected llama")
    tensors = {t.name: t for t in reader.tensors}
    n_layer = int(meta["llama.block_count"])
    n_head = int(meta["llama.attention.head_count"])
    n_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    hidden = int(meta["llama.embedding_length"])
    head_dim = int(meta.get("llama.attention.key_length", meta.get("llama.rope.dimension_count", hidden // n_head)))
    rope: dict[str, Any] = {"rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)), "rope_type": "default"}
    if meta.get("llama.rope.scaling.type") == "linear":
        rope.update(rope_type="linear", factor=float(meta["llama.rope.scaling.factor"]))
    vocab = int(meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"])))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        num_hidden_layers=n_layer,
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        head_dim=head_dim,
        max_position_embeddings=int(meta["llama.context_length"]),
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        rope_parameters=rope,
        tie_word_embeddings="output.weight" not in tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layer)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state: dict[str, torch.Tensor] = {}
    for hf_name in model.state_dict():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if gguf_name not in tensors:
            raise ValueError(f"{path}: tensor {gguf_name} (for {hf_name}) is missing")
        t = tensors[gguf_name]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        array = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if ".q_proj." in hf_name:
            array = unpermute(array, n_head)
        elif ".k_proj." in hf_name:
            array = unpermute(array, n_kv)
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(array))
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    # Built on the meta device (no random init of weights about to be replaced): make the rotary buffers real.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    model.eval()
    return model.float(), meta


def tokenizer_check(meta: dict[str, Any], tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """Tokens, merges, special ids, chat template; then the prompts re-tokenized from the file alone."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from backend.export.gguf_writer import tokenizer_metadata

    expected = tokenizer_metadata(tokenizer, len(meta["tokenizer.ggml.tokens"]))
    problems = []
    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != expected.pre:
        problems.append("tokenizer model/pre")
    if list(meta["tokenizer.ggml.tokens"]) != expected.tokens:
        problems.append("token list")
    if [int(x) for x in meta["tokenizer.ggml.token_type"]] != expected.types:
        problems.append("token types")
    if list(meta.get("tokenizer.ggml.merges", [])) != expected.merges:
        problems.append("merges")
    keys = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id"}
    for kind, value in expected.special_ids.items():
        if meta.get(f"tokenizer.ggml.{keys[kind]}") != value:
            problems.append(f"{kind} id")
    if meta.get("tokenizer.chat_template") != expected.chat_template:
        problems.append("chat template")
    mismatched = 0
    if not problems:
        tokens = meta["tokenizer.ggml.tokens"]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
        rebuilt = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        rebuilt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        rebuilt.decoder = decoders.ByteLevel()
        control = [tokens[i] for i, kind in enumerate(meta["tokenizer.ggml.token_type"]) if int(kind) == 3]
        rebuilt.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
        for text in texts:
            if rebuilt.encode(text, add_special_tokens=False).ids != tokenizer(text, add_special_tokens=False)["input_ids"]:
                mismatched += 1
        if mismatched:
            problems.append(f"{mismatched} of {len(texts)} prompts tokenize differently")
    return {
        "name": "tokenizer",
        "what": "GGUF tokenizer metadata (model gpt2, pre gpt-2, tokens, types, merges, special ids, chat "
                "template) equals the run's tokenizer, and a BPE built from the file alone tokenizes the "
                f"{len(texts)} fixed prompts identically",
        "measured": "identical" if not problems else "differs: " + ", ".join(problems),
        "tolerance": "identical",
        "passed": not problems,
    }
