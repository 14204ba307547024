"""GgufExport: a merged model and its tokenizer written as one GGUF file for llama.cpp and Ollama.

What is written for each family (architecture name, hyper-parameters, tensor layout) lives in
gguf_families and gguf_tensors, the tokenizer in gguf_tokenizer; this module plans the tensor types
and writes the file. Types follow convert_hf_to_gguf.py: 1-D tensors, norms, biases, MoE routers and
GPT-2's position embeddings in F32; 2-D and 3-D weights in the chosen type unless their rows are not a
whole number of quantization blocks (then F16). In the 4- and 5-bit formats the output head (or
token_embd when it doubles as the head) is kept at Q8_0, as llama-quantize keeps the head above 4
bits (it uses Q6_K, which gguf-py cannot write). Quantization is gguf-py's numpy code.

Tensors are converted and written one at a time (stacked experts one expert at a time), so the file
never needs a second copy of the model in memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gguf
import numpy as np

from backend.core.errors import bad_input
from backend.core.registries.export_formats import GGUF_TYPES
from backend.export.gguf_families import Family, family_of
from backend.export.gguf_tensors import TensorPlan, matrices, permute, plan_tensors
from backend.export.gguf_tokenizer import adds_special, tokenizer_metadata
from backend.export.tensor_source import TensorSource

__all__ = ["GgufExport", "adds_special", "check_architecture", "permute"]  # modelfile.py uses adds_special
Q = gguf.GGMLQuantizationType
F32_SUFFIXES = (".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight", "position_embd.weight")
"""Kept in F32 whatever the format, as convert_hf_to_gguf.py does: MoE routers, GPT-2's positions."""


def check_architecture(hf_config: Any) -> str:
    """The llama.cpp architecture this model is written as, or a one-sentence refusal."""
    family, _ = family_of(hf_config)
    return family.name


def is_tied(config: Any, text_config: Any) -> bool:
    value = getattr(text_config, "tie_word_embeddings", None)
    return bool(getattr(config, "tie_word_embeddings", False) if value is None else value)


class GgufExport:
    """Plan, then write, one GGUF file from a merged model's tensors (a TensorSource, one at a time)."""

    def __init__(self, source: TensorSource, tokenizer: Any, fmt: str, name: str):
        self.source = source
        self.config = source.config
        self.family: Family
        self.family, self.text_config = family_of(self.config)
        self.arch = self.family.name
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.name = name
        self.qtype = getattr(Q, GGUF_TYPES[fmt])
        self.tied = is_tied(self.config, self.text_config)
        self.meta = tokenizer_metadata(tokenizer, self.text_config.vocab_size)
        self.plan = plan_tensors(self.family, self.text_config, source, self.tied)
        for t in self.plan:
            t.ggml_type = self._type_for(t)
            t.nbytes = self._nbytes(t.shape, t.ggml_type)

    # --- planning -------------------------------------------------------------------------------
    def _type_for(self, t: TensorPlan) -> Any:
        name, shape = t.gguf_name, t.shape
        if (t.op == "values" or len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
                or name.endswith(F32_SUFFIXES)):
            return Q.F32
        qtype = self.qtype
        head = name == "output.weight" or (name == "token_embd.weight" and (self.tied or self.family.no_output))
        if qtype in (Q.Q4_0, Q.Q5_0) and head:
            qtype = Q.Q8_0  # the output head, as llama-quantize keeps it above 4/5 bits
        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        if shape[-1] % block != 0:
            return Q.F16  # rows that are not whole blocks stay 16-bit, as llama.cpp's converter does
        return qtype

    @staticmethod
    def _nbytes(shape: tuple[int, ...], qtype: Any) -> int:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return int(np.prod(shape)) // block * size

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
        writer.add_name(self.name)
        writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{GGUF_TYPES[self.fmt]}"]))  # MOSTLY_Q8_0, ...
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        self.family.hparams(self.text_config, writer)
        if self.family.whole_config_keys is not None:
            self.family.whole_config_keys(self.config, writer)
        self.meta.write(writer)

    def _encode(self, array: np.ndarray, t: TensorPlan) -> np.ndarray:
        if t.ggml_type == Q.F32:
            return np.ascontiguousarray(array, dtype=np.float32)
        if t.ggml_type == Q.F16:
            out = np.ascontiguousarray(array, dtype=np.float16)
            if not np.isfinite(out).all():
                raise bad_input(f"tensor {t.hf_name} has values beyond float16's range (±65504), which an F16 GGUF "
                                "cannot hold", "export gguf-q8_0 (block-scaled) or merged instead")
            return out
        return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), t.ggml_type)

    def _data(self, t: TensorPlan) -> np.ndarray:
        pieces = [self._encode(piece, t) for piece in matrices(t, self.source)]
        data = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        if data.nbytes != t.nbytes:
            raise RuntimeError(f"{t.gguf_name}: {data.nbytes} bytes written, {t.nbytes} planned")
        return data

    def write(self, path: Path, progress: Callable[[int, int], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> None:
        writer = gguf.GGUFWriter(path, self.arch)
        try:
            self._metadata(writer)
            for t in self.plan:
                dtype = np.float16 if t.ggml_type == Q.F16 else np.float32
                raw = None if t.ggml_type in (Q.F16, Q.F32) else t.ggml_type
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
