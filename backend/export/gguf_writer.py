"""GgufExport: a merged Llama model and its tokenizer written as one GGUF file for llama.cpp and Ollama.

Follows llama.cpp's convert_hf_to_gguf.py for the Llama architecture: tensor names from gguf's own
name map, Q and K projections permuted from the Hugging Face rotary layout (halves) to GGML's
(interleaved pairs), 1-D tensors in F32, 2-D tensors in the chosen type unless their rows are not a
whole number of quantization blocks (then F16, as the converter does), and a byte-level BPE
tokenizer with its merges, special tokens and chat template in the metadata. Quantization (Q8_0,
Q5_0, Q4_0) is gguf-py's numpy code; the K-quants are not available there. Tied embeddings write
no output.weight: llama.cpp reads token_embd as the output head then, so in the 4- and 5-bit formats
token_embd is kept at Q8_0, as llama-quantize keeps the output head at higher precision.

Tensors are quantized and written one at a time, so the file never needs a second copy in memory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from backend.errors import bad_input
from backend.export.formats import GGUF_ARCHITECTURES, GGUF_TYPES
from backend.export.tensor_source import TensorSource

log = logging.getLogger(__name__)
SUPPORTED_ROPE = ("default", "linear")


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotary layout -> GGML's: llama.cpp convert_hf_to_gguf.py `permute` (rows of one head)."""
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `permute`: GGML's rotary layout back to Hugging Face's."""
    shape = weights.shape
    return weights.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def check_architecture(hf_config: Any) -> str:
    """The GGUF architecture for this model, or a one-sentence refusal naming the supported ones."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in GGUF_ARCHITECTURES:
        supported = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise bad_input(f"GGUF export supports the {supported} architecture (like the bundled model); "
                        f"this model is {model_type}", "export merged, bnb-8bit or bnb-4bit instead")
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE:
        raise bad_input(f"GGUF export supports rotary scaling {' and '.join(SUPPORTED_ROPE)}; this model uses {rope_type}",
                        "export merged, bnb-8bit or bnb-4bit instead")
    return GGUF_ARCHITECTURES[model_type]


@dataclass
class TokenizerMetadata:
    model: str
    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special_ids: dict[str, int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def tokenizer_metadata(tokenizer: Any, vocab_size: int) -> TokenizerMetadata:
    """The tokenizer as llama.cpp's "gpt2" (byte-level BPE) model reads it, or a refusal."""
    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise bad_input("GGUF export needs a fast (tokenizer.json) tokenizer; this model has only a slow one",
                        "export merged instead")
    spec = json.loads(backend.to_str())
    model, pre = spec.get("model", {}), spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        kind = f"{model.get('type')} with a {pre.get('type')} pre-tokenizer"
        raise bad_input(f"GGUF export supports byte-level BPE tokenizers (GPT-2 style, like the bundled model); "
                        f"this tokenizer is {kind}", "export merged, bnb-8bit or bnb-4bit instead")
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise bad_input(f"the tokenizer has ids up to {max(vocab.values())} but the model only {vocab_size} embeddings")
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        elif i in added:
            tokens.append(reverse[i])
            types.append(int(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED))
        else:
            tokens.append(reverse[i])
            types.append(int(gguf.TokenType.NORMAL))
    merges = []
    for merge in model.get("merges", []):
        pair = merge if isinstance(merge, list) else merge.split(" ")
        if any(" " in part for part in pair):
            raise bad_input("the tokenizer has merges containing spaces, which GGUF's merge list cannot hold")
        merges.append(" ".join(pair))
    special = {name: getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "unk", "pad")}
    return TokenizerMetadata(
        model="gpt2",
        pre="gpt-2",  # llama.cpp's name for the GPT-2 regex (ByteLevel use_regex): llama-vocab.cpp
        tokens=tokens,
        types=types,
        merges=merges,
        special_ids={k: int(v) for k, v in special.items() if v is not None},
        add_bos=adds_special(tokenizer, "bos"),
        add_eos=adds_special(tokenizer, "eos"),
        chat_template=tokenizer.chat_template if isinstance(getattr(tokenizer, "chat_template", None), str) else None,
    )


def adds_special(tokenizer: Any, kind: str) -> bool:
    """Whether encoding plain text adds BOS (or EOS): observed, since transformers 5 adds it in the
    post-processor and its add_bos_token attribute can say False while BOS is added."""
    token_id = getattr(tokenizer, f"{kind}_token_id", None)
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0 if kind == "bos" else -1] == token_id


@dataclass
class TensorPlan:
    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]
    ggml_type: Any  # gguf.GGMLQuantizationType
    nbytes: int
    permute_heads: int = 0  # >0: permute rows for that many heads first


class GgufExport:
    """Plan, then write, one GGUF file from a merged model's tensors (a TensorSource, one at a time)."""

    def __init__(self, source: TensorSource, tokenizer: Any, fmt: str, name: str):
        import gguf

        self.gguf = gguf
        self.source = source
        self.config = source.config
        self.arch = check_architecture(self.config)
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.name = name
        self.qtype = getattr(gguf.GGMLQuantizationType, GGUF_TYPES[fmt])
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.meta = tokenizer_metadata(tokenizer, self.config.vocab_size)
        self.plan = self._plan()

    # --- planning -------------------------------------------------------------------------------
    def _type_for(self, gguf_name: str, shape: tuple[int, ...]) -> Any:
        types = self.gguf.GGMLQuantizationType
        if len(shape) <= 1 or gguf_name.endswith("_norm.weight"):
            return types.F32
        qtype = self.qtype
        if qtype in (types.Q4_0, types.Q5_0) and gguf_name in ("output.weight", "token_embd.weight"):
            if gguf_name == "output.weight" or self.tied:
                qtype = types.Q8_0  # the output head, as llama-quantize keeps it above 4/5 bits
        block, _ = self.gguf.GGML_QUANT_SIZES[qtype]
        if shape[-1] % block != 0:
            return types.F16  # rows that are not whole blocks stay 16-bit, as llama.cpp's converter does
        return qtype

    def _nbytes(self, shape: tuple[int, ...], qtype: Any) -> int:
        block, size = self.gguf.GGML_QUANT_SIZES[qtype]
        return int(np.prod(shape)) // block * size

    def _plan(self) -> list[TensorPlan]:
        cfg = self.config
        names = self.gguf.get_tensor_name_map(self.gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
        n_head, n_kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        plan = []
        for hf_name in self.source.names():
            if hf_name == "lm_head.weight" and self.tied:
                continue  # llama.cpp uses token_embd as the output head when output.weight is absent
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise bad_input(f"tensor {hf_name} has no GGUF name for the {self.arch} architecture",
                                "export merged instead")
            shape = tuple(self.source.shape(hf_name))
            heads = n_head if ".q_proj." in hf_name else n_kv if ".k_proj." in hf_name else 0
            qtype = self._type_for(gguf_name, shape)
            plan.append(TensorPlan(gguf_name, hf_name, shape, qtype, self._nbytes(shape, qtype), heads))
        return plan

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.plan)

    def type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.plan:
            counts[t.ggml_type.name] = counts.get(t.ggml_type.name, 0) + 1
        return counts

    # --- writing --------------------------------------------------------------------------------
    def _metadata(self, writer: Any) -> None:
        cfg, g = self.config, self.gguf
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        writer.add_name(self.name)
        file_types = {"F16": g.LlamaFileType.MOSTLY_F16, "Q8_0": g.LlamaFileType.MOSTLY_Q8_0,
                      "Q5_0": g.LlamaFileType.MOSTLY_Q5_0, "Q4_0": g.LlamaFileType.MOSTLY_Q4_0}
        writer.add_file_type(int(file_types[GGUF_TYPES[self.fmt]]))
        writer.add_quantization_version(g.GGML_QUANT_VERSION)
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_block_count(cfg.num_hidden_layers)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_head_count_kv(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
        writer.add_rope_dimension_count(head_dim)
        if head_dim != cfg.hidden_size // cfg.num_attention_heads:
            writer.add_key_length(head_dim)
            writer.add_value_length(head_dim)
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
        if rope.get("rope_type", rope.get("type")) == "linear":
            writer.add_rope_scaling_type(g.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(rope["factor"]))
        meta = self.meta
        writer.add_tokenizer_model(meta.model)
        writer.add_tokenizer_pre(meta.pre)
        writer.add_token_list(meta.tokens)
        writer.add_token_types(meta.types)
        writer.add_token_merges(meta.merges)
        for kind, token_id in meta.special_ids.items():
            getattr(writer, f"add_{kind}_token_id")(token_id)
        writer.add_add_bos_token(meta.add_bos)
        writer.add_add_eos_token(meta.add_eos)
        if meta.chat_template:
            writer.add_chat_template(meta.chat_template)

    def _data(self, t: TensorPlan) -> np.ndarray:
        array = self.source.get(t.hf_name).float().numpy()
        if t.permute_heads:
            array = permute(array, t.permute_heads)
        types = self.gguf.GGMLQuantizationType
        if t.ggml_type == types.F32:
            return np.ascontiguousarray(array, dtype=np.float32)
        if t.ggml_type == types.F16:
            return np.ascontiguousarray(array, dtype=np.float16)
        return self.gguf.quants.quantize(np.ascontiguousarray(array), t.ggml_type)

    def write(self, path: Path, progress: Callable[[int, int], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> None:
        writer = self.gguf.GGUFWriter(path, self.arch)
        try:
            self._metadata(writer)
            for t in self.plan:
                dtype = np.float16 if t.ggml_type == self.gguf.GGMLQuantizationType.F16 else np.float32
                raw = None if t.ggml_type.name in ("F16", "F32") else t.ggml_type
                writer.add_tensor_info(t.gguf_name, t.shape, np.dtype(dtype), t.nbytes, raw_dtype=raw)
            writer.write_header_to_file(path)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for index, t in enumerate(self.plan, start=1):
                if should_stop and should_stop():
                    raise InterruptedError("stop requested")
                writer.write_tensor_data(self._data(t))
                if progress:
                    progress(index, len(self.plan))
        finally:
            writer.close()
