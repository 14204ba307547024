"""The check of a vision-language run's GGUF pair: both files read back and rebuilt into the image-text model.

The mmproj file has no reader outside llama.cpp, so it is read with gguf-py's GGUFReader (which shares
no code with our writer) and the converter's rearrangements are undone by the layout's `expected` table,
written by hand from clip.cpp's tensor names, not derived from the gguf-py map the writer used: a
tensor written under the wrong name or in the wrong shape fails `mmproj_check`. The language model's
weights are read back by transformers' GGUF loader where it knows the architecture (gemma3, llama; only
its weights: the image-text model is built from the run's config, so keys that loader cannot rebuild do
not matter here, and what llama.cpp would compute differently is refused by gguf_families before
writing); llama.cpp's qwen2vl (Qwen2.5-VL's language model) it does not know, so that file is read with
GGUFReader and qwen2vl's tensor names (QWEN_VL_NAMES, plain copies: no permutation or shift; qwen3vl alike).
`read_back_pair` loads both into the image-text model, every parameter from the files, so the export is
measured on the run's own image rows like the other formats.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.core.runs.export_report import FAILED, PASSED
from backend.export.gguf_families import family_of
from backend.export.gguf_pages import released_pages
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.export.mmproj_layouts import MmprojLayout

F16_STEP = 2.0 ** -11
"""F16's relative rounding: a value written as F16 is within this fraction of itself (normal range)."""
TEXT_PREFIXES = ("model.language_model.", "model.text_model.", "language_model.model.")
QWEN_VL_NAMES = (
    ("token_embd.weight", "model.embed_tokens.weight"), ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"), ("blk.{0}.attn_norm.weight", "model.layers.{0}.input_layernorm.weight"),
    ("blk.{0}.ffn_norm.weight", "model.layers.{0}.post_attention_layernorm.weight"),
    ("blk.{0}.attn_output.weight", "model.layers.{0}.self_attn.o_proj.weight"),
    *((f"blk.{{0}}.attn_{p}.{s}", f"model.layers.{{0}}.self_attn.{p}_proj.{s}") for p in "qkv" for s in ("weight", "bias")),
    *((f"blk.{{0}}.ffn_{p}.weight", f"model.layers.{{0}}.mlp.{p}_proj.weight") for p in ("gate", "up", "down")),
    *((f"blk.{{0}}.attn_{p}_norm.weight", f"model.layers.{{0}}.self_attn.{p}_norm.weight") for p in "qk"),
)
"""llama.cpp's qwen2vl and qwen3vl tensor names -> a Qwen2/Qwen3 decoder's (LLM_ARCH_QWEN2VL, LLM_ARCH_QWEN3VL:
Q/K/V biases in the first, q/k norms in the second); transformers' GGUF loader has neither architecture."""
READ_AS_QWEN = ("QWEN2VL", "QWEN3VL")


def _arrays(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file as fp32 in numpy (row-major, Hugging Face) order, dequantized by gguf-py."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(path).tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
    return out


def _expand(pattern: str, names: set[str]) -> list[str]:
    """The block numbers a `{0}` pattern takes in `names` (["" ] for a pattern without one)."""
    if "{0}" not in pattern:
        return [""]
    regex = re.compile("^" + re.escape(pattern).replace(r"\{0\}", r"(\d+)") + "$")
    return sorted({m.group(1) for n in names if (m := regex.match(n))}, key=int)


def unpack_mmproj(path: Path, layout: MmprojLayout) -> tuple[dict[str, np.ndarray], list[str]]:
    """(converter name -> tensor as the model holds it, the file's tensors no row of `expected` took)."""
    stored = _arrays(path)
    used: set[str] = set()
    out: dict[str, np.ndarray] = {}
    for hf_pattern, gguf_patterns in layout.expected:
        for block in _expand(gguf_patterns[0], set(stored)):
            names = [p.format(block) for p in gguf_patterns]
            if not all(n in stored for n in names):
                continue
            parts = [stored[n] for n in names]
            used.update(names)
            if len(parts) == 3:  # a fused QKV: Q, K and V rows back one above the other
                value = np.concatenate(parts, axis=0)
            elif len(parts) == 2:  # a Conv3D kernel's two time steps
                value = np.stack(parts, axis=2)
            else:
                value = parts[0]
            name = hf_pattern.format(block)
            out[name] = value - 1.0 if name in layout.norm_shift else value
    return out, sorted(set(stored) - used)


def mmproj_check(path: Path, layout: MmprojLayout, source: Any, vision: dict[str, Any]) -> dict[str, Any]:
    """Every tower and projector tensor of the merged model, found in the mmproj file under clip.cpp's name and
    equal to it within F16's rounding (F32 tensors exactly), and nothing else in the file."""
    unpacked, extra = unpack_mmproj(path, layout)
    problems, worst, count = [], 0.0, 0
    for hf_name in source.names():
        converter = layout.converter_name(hf_name, vision)
        if converter is None:
            continue
        want = source.get(hf_name).float().numpy()
        got = unpacked.pop(converter, None)
        if got is None or got.shape != want.shape:
            problems.append(f"{hf_name} {'missing' if got is None else f'has shape {got.shape}, not {want.shape}'}")
            continue
        count += 1
        error = np.abs(got - want) - F16_STEP * np.abs(want)
        worst = max(worst, float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30)))
        if float(error.max()) > 1e-7:
            problems.append(f"{hf_name} differs by {float(np.max(np.abs(got - want))):.3g}")
    problems += [f"{name} is not a tensor of this model" for name in [*unpacked, *extra]]
    return {"name": "mmproj tensors",
            "what": f"every tower and projector tensor read back from {path.name} with gguf-py's reader, llama.cpp's "
                    f"{layout.projector_type} layout undone by clip.cpp's tensor names (QKV rejoined, Conv3D kernel "
                    "restacked, norm shift removed), equals the trained model's within F16 rounding",
            "measured": f"{count} tensors, largest difference {worst:.2e} of the tensor's largest value"
                        + (f"; {len(problems)} wrong: " + "; ".join(problems[:3]) if problems else ""),
            "tolerance": f"F16 rounding ({F16_STEP:.2e} of each value); F32 exact",
            "outcome": FAILED if problems else PASSED, "passed": not problems, "verified": True}


def _text_state(path: Path, config: Any, device: str) -> tuple[dict[str, torch.Tensor] | None, str]:
    """(the language model's tensors in a causal LM's names, how read) or (None, why it could not be read)."""
    family, _ = family_of(config)
    if family.arch in READ_AS_QWEN:
        stored = _arrays(path)
        state: dict[str, torch.Tensor] = {}
        for gguf_pattern, hf_pattern in QWEN_VL_NAMES:
            for block in _expand(gguf_pattern, set(stored)):
                if gguf_pattern.format(block) in stored:  # output.weight is absent when tied to token_embd
                    state[hf_pattern.format(block)] = torch.from_numpy(stored.pop(gguf_pattern.format(block)))
        if stored:
            return None, f"{path.name} holds tensors {family.name} does not name: {', '.join(sorted(stored)[:3])}"
        return state, (f"gguf-py's reader with llama.cpp's {family.name} names (transformers has no {family.name} "
                       "GGUF reader)")
    if family.reader is not None:
        return None, family.reader
    from transformers import AutoModelForCausalLM, GgufConfig

    try:  # its weights only: the image-text model is built from the run's config, not from the file's keys
        with released_pages():
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         quantization_config=GgufConfig(dequantize=True),
                                                         device_map={"": "cpu"}, **LOAD_KWARGS)
    except Exception as exc:  # its loader raises on shapes it rebuilt wrong; say what it said
        return None, f"transformers' GGUF loader failed on {path.name} ({type(exc).__name__}: {str(exc)[:160]})"
    state = {k: v for k, v in model.state_dict().items()}
    return state, f"transformers' GGUF loader ({type(model).__name__}'s weights)"


def _text_name(name: str) -> str:
    for prefix in TEXT_PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return name.removeprefix("language_model.")


def read_back_pair(text_path: Path, mmproj_path: Path, layout: MmprojLayout, folder: Path, config: Any,
                   device: str, dtype: torch.dtype, vision_config: dict[str, Any]) -> tuple[Any, str, str | None]:
    """(the image-text model with every parameter from the two files, how it was read, None) or (None, "", why)."""
    from transformers import AutoModelForImageTextToText

    from backend.export.gguf_check import widen

    text, how = _text_state(text_path, config, device)
    if text is None:
        return None, "", how
    vision, _ = unpack_mmproj(mmproj_path, layout)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype, device_map={"": device}).eval()
    missing = []
    with torch.no_grad():
        for name, param in model.state_dict(keep_vars=True).items():
            converter = layout.converter_name(name, vision_config)
            value = vision.get(converter) if converter is not None else text.get(_text_name(name))
            if value is None and _text_name(name) == "lm_head.weight":  # tied: llama.cpp reads token_embd
                value = text.get("model.embed_tokens.weight")
            if value is None or tuple(value.shape) != tuple(param.shape):
                missing.append(name)
                continue
            # the tower and projector are small: held fp32, so the pixels are cast to fp32 where they enter it
            param.data = torch.as_tensor(value).to(device=device, dtype=torch.float32 if converter else param.dtype)
    if missing:
        del model
        return None, "", f"the two files do not hold {len(missing)} of the model's tensors ({', '.join(missing[:3])})"
    precision = str(dtype).removeprefix("torch.")
    return widen(model), (f"the language model by {how}, the mmproj by gguf-py's reader, loaded into "
                          f"{type(model).__name__} ({precision} language-model weights, float32 tower, projector "
                          f"and activations) on {device}"), None


def tokenizer_check(path: Path, tokenizer: Any, arch: str) -> dict[str, Any]:
    """gguf_check.tokenizer_check on the file's tokenizer. transformers' GGUF tokenizer reader refuses an
    architecture it has no model for (qwen2vl, qwen3vl) although the tokenizer keys do not depend on it: for such a file
    every `tokenizer.*` key is copied, value and type as gguf-py reads them, into a vocabulary-only GGUF
    labelled qwen2 (whose tokenizer keys are the same), which transformers then reads."""
    import tempfile

    import gguf

    from backend.export import gguf_check

    if arch not in ("qwen2vl", "qwen3vl"):
        return gguf_check.tokenizer_check(path, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        writer = gguf.GGUFWriter(copy, "qwen2")
        for key, field in gguf.GGUFReader(path).fields.items():
            if key.startswith("tokenizer."):
                sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
                writer.add_key_value(key, field.contents(), field.types[0], sub)
        writer.write_header_to_file(copy)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        check = gguf_check.tokenizer_check(copy, tokenizer)
    check["what"] += (f"; read from a vocabulary-only copy of {path.name}'s tokenizer keys labelled qwen2, since "
                      f"transformers' reader refuses the {arch} label")
    return check
