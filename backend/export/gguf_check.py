"""The GGUF export's check: the file read back by transformers' own GGUF loader, which shares no code with our writer.

`AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)` rebuilds the config from llama.cpp's
metadata keys and un-does llama.cpp's tensor layout with its own code (written against
convert_hf_to_gguf.py), its weights in 16 bits (`read_dtype`) and its activations in fp32 (`widen`),
on the GPU when there is one;
its logits and perplexity are then measured against the trained model. Where that reader cannot read a family (GPT-NeoX; Mixtral, which
it reads as a dense Llama) or rebuilds a config attribute differently from the model's (it ignores
keys it has no mapping for and falls back to the config class's defaults), the check says so:
"not verified", why, and how to verify with llama.cpp itself. It never falls back to our own code.
`AutoTokenizer.from_pretrained(folder, gguf_file=...)` rebuilds the tokenizer from the file for the
tokenizer check.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from backend.export import verify
from backend.export.gguf_families import family_of, head_dim, kv_heads
from backend.export.gguf_pages import released_pages
from backend.core.runs.export_report import FAILED, NOT_VERIFIED, PASSED
from backend.runtime.hub_kernels import LOAD_KWARGS

EXTRA_TEXTS = (
    "Numbers: 3 33 333 3333 and 3.14159, then 2024-01-31.",
    "Spaces:  two   three    four, a tab\there and\nnew lines\n\n  indented.",
    "Ünïcödé — ça va? 日本語のテキスト 🙂 مرحبا",
    " leading space, trailing space ",
)
HOW_TO_VERIFY = ("read it with llama.cpp itself: install llama-cpp-python (built from source), export this run "
                 "--format merged too, then from the project's source run `python bench/llama_cpp_check.py {path} "
                 "--hf MERGED_EXPORT_FOLDER` (it compares llama.cpp's logits and tokens with the merged model's)")
EXACT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
"""GGML float types and the torch dtype that holds their values exactly."""


class WideLinear(torch.nn.Linear):
    """A Linear whose weight stays 16-bit while its input, product and output are fp32 (a slice of the
    weight widened at a time: verify.fp32_linear), so the read-back model costs 2 bytes a weight."""

    forward = verify.fp32_linear


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-5, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _shown(value: Any) -> str:
    """A value for the one-line reason: a long list (longrope's factors) as its head and length."""
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"[{', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in value[:2])}, ... {len(value)} values]"
    return str(value)


def _value(cfg: Any, key: str) -> Any:
    """The attribute as the model uses it (head_dim and KV heads have defaults computed from others)."""
    if key == "head_dim" and hasattr(cfg, "num_attention_heads"):
        return head_dim(cfg)
    if key == "num_key_value_heads" and hasattr(cfg, "num_attention_heads"):
        return kv_heads(cfg)
    return getattr(cfg, key, None)


def config_mismatches(model_config: Any, read_config: Any, keys: tuple[str, ...]) -> list[str]:
    """Forward-relevant attributes the reader rebuilt differently: 'name=read (model has value)'."""
    out = []
    for key in keys:
        want = _value(model_config, key)
        if want is None:
            continue
        got = _value(read_config, key)
        if key == "rope_parameters":
            flat_want, flat_got = _flat(want), _flat(got or {})
            for sub, value in sorted(flat_want.items(), key=lambda item: not item[0].endswith("rope_type")):
                if not _same(value, flat_got.get(sub)):
                    out.append(f"rope_parameters.{sub}={_shown(flat_got.get(sub))} (the model has {_shown(value)})")
        elif not _same(want, got):
            out.append(f"{key}={_shown(got)} (the model has {_shown(want)})")
    return out


def not_verified(name: str, tolerance: Any, reason: str, path: Path) -> dict[str, Any]:
    """A check no independent reader here could run: neither passed nor failed, and how to run it elsewhere."""
    return {
        "name": name,
        "what": "an independent reader (transformers' GGUF loader) reproducing the trained model from the file",
        "measured": f"not verified: {reason}",
        "tolerance": tolerance,
        "outcome": NOT_VERIFIED,
        "passed": False,
        "verified": False,
        "reason": reason,
        "how_to_verify": HOW_TO_VERIFY.format(path=path),
    }


def weight_types(path: Path) -> set[str]:
    """The GGML types of the file's tensors (its header only)."""
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def read_dtype(types: set[str]) -> torch.dtype:
    """The dtype the file's weights are read into: one that holds them exactly, or nearly, in 2 bytes.

    transformers' GGUF reader dequantizes every tensor to fp32, then casts it to this dtype. F16 values fit
    fp16 exactly (never bf16: 8 significant bits against F16's 11), BF16 values bf16. Quantized blocks
    (Q8_0, Q5_0, Q4_0) are an fp16 scale d times small integers q, up to 18 significant bits: fp16 rounds
    each product by at most 2^-11 of itself (|q| d/2048: at most 0.062 d for Q8_0, 0.0078 d for Q5_0,
    0.0039 d for Q4_0) against the format's own rounding of up to d/2. Measured on Gaussian weights
    (tests/backend/test_gguf_read_precision.py), fp16's rounding RMS is 3.9% of Q8_0's own error RMS,
    0.42% of Q5_0's, 0.20% of Q4_0's; independent, they add in quadrature: Q8_0's error grows by 0.075%.
    The file's F32 tensors (norms, biases) hold the trained model's 16-bit values, which fp16 holds
    exactly in [2^-17, 65504] (bf16's 8 bits above fp16's subnormal step 2^-24). The activations stay
    fp32 (`widen`): Gemma's overflow fp16. A file mixing F16 and BF16 (no 16-bit type holds both), or
    all F32, is read in fp32.
    """
    halves = {EXACT.get(name, torch.float16) for name in types} - {torch.float32}
    return halves.pop() if len(halves) == 1 else torch.float32


def _widen_own(module: torch.nn.Module, _inputs: Any) -> None:
    """Forward pre-hook: the module's own 16-bit matrices (experts, GPT-2's Conv1D) in fp32 for this call."""
    module.narrow_weights = {}
    for name, param in module.named_parameters(recurse=False):
        if param.dtype != torch.float32:
            module.narrow_weights[name] = param.data
            param.data = param.data.float()


def _narrow_own(module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
    """Forward hook: back to the 16-bit matrices _widen_own kept, the fp32 copies freed."""
    for name, data in module.__dict__.pop("narrow_weights", {}).items():
        getattr(module, name).data = data


def widen(model: Any) -> Any:
    """The model with fp32 activations around its 16-bit weights: a Linear multiplies in fp32 a slice at a
    time, an Embedding's output is widened, any other module's matrices are widened only while it runs
    (one layer's experts at most), and vectors (norms, biases) and buffers are made fp32 for good."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype != torch.float32:
            module.__class__ = WideLinear
        if isinstance(module, torch.nn.Embedding):
            module.register_forward_hook(lambda _module, _inputs, output: output.float())
        skip = "weight" if type(module) is WideLinear or isinstance(module, torch.nn.Embedding) else None
        narrow = [(name, param) for name, param in module.named_parameters(recurse=False)
                  if name != skip and param.is_floating_point() and param.dtype != torch.float32]
        for _, param in narrow:
            if param.dim() <= 1:
                param.data = param.data.float()
        if any(param.dim() > 1 for _, param in narrow):
            module.register_forward_pre_hook(_widen_own)
            module.register_forward_hook(_narrow_own)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer.is_floating_point():
                setattr(module, name, buffer.float())
    return model


def read_back(path: Path, config: Any, device: str) -> tuple[Any, str, str | None]:
    """(the model transformers' GGUF loader builds from the file, how it was loaded, None), or (None,
    "", why it cannot be verified). Weights in `read_dtype`, activations in fp32 (`widen`). Every family we
    write takes transformers' legacy path (load_gguf_checkpoint: each tensor dequantized, cast to `dtype`,
    then loaded); dequantize=True keeps the newer packed path (qwen35, lfm2) from fetching Hub kernels."""
    from transformers import AutoModelForCausalLM, GgufConfig

    family, text_config = family_of(config)
    if family.reader is not None:
        return None, "", family.reader
    dtype = read_dtype(weight_types(path))
    try:
        with released_pages():
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                         quantization_config=GgufConfig(dequantize=True),
                                                         device_map={"": device}, **LOAD_KWARGS).eval()
    except Exception as exc:  # its loader raises on shapes it rebuilt wrong; say what it said
        return None, "", (f"transformers' GGUF loader failed on this file "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})")
    mismatches = config_mismatches(text_config, model.config, family.forward_keys)
    if mismatches:
        del model
        return None, "", "transformers' GGUF loader has no mapping for some of the file's keys and rebuilt " + \
            "; ".join(mismatches[:4])
    weights = str(dtype).removeprefix("torch.")
    precision = "float32" if dtype == torch.float32 else f"{weights} weights, float32 activations and products"
    return widen(model), f"transformers' GGUF loader -> {type(model).__name__}, {precision} on {device}", None


def tokenizer_check(path: Path, tokenizer: Any) -> dict[str, Any]:
    """The tokenizer transformers rebuilds from the file alone encodes the prompts and test texts like the run's."""
    import gguf
    from transformers import AutoTokenizer

    fields = gguf.GGUFReader(path).fields
    model, pre = (fields[f"tokenizer.ggml.{key}"].contents() for key in ("model", "pre"))
    texts, kind, skipped = verify.prompt_texts(tokenizer) + list(EXTRA_TEXTS), "the chat-rendered prompts", ""
    if model == "llama":  # SentencePiece-style: the two readers disagree on the "▁" after special tokens
        texts = list(verify.PROMPTS) + [t for t in EXTRA_TEXTS if not t[:1].isspace()]
        kind = "the plain prompts"
        skipped = ("; texts with special tokens or a leading space left out: transformers' reader prepends '▁' "
                   "only at the start of the text, llama.cpp also after every special token")
    if pre == "smollm":  # transformers' reader has no smollm entry and splits digit runs like GPT-2
        texts = [t for t in texts if not any(c.isdigit() for c in t)]
        skipped = "; texts with digits left out: transformers' GGUF tokenizer reader does not split digits as smollm does"
    what = (f"the tokenizer transformers rebuilds from the GGUF alone encodes {len(texts)} texts ({kind} and "
            f"{len(texts) - len(verify.PROMPTS)} with digits, whitespace runs and non-Latin scripts) to the same ids "
            f"as the run's tokenizer, with the same BOS/EOS and chat template{skipped}")
    try:
        rebuilt = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:
        reason = f"transformers cannot rebuild this tokenizer from the file ({type(exc).__name__}: {str(exc)[:160]})"
        check = not_verified("tokenizer", "identical", reason, path)
        check["what"] = what
        return check
    failures = []
    differing = sum(tokenizer(t, add_special_tokens=False)["input_ids"] != rebuilt(t, add_special_tokens=False)["input_ids"]
                    for t in texts)
    if differing:
        failures.append(f"{differing} of {len(texts)} texts tokenize differently")
    for kind in ("bos", "eos"):
        if getattr(tokenizer, f"{kind}_token_id") != getattr(rebuilt, f"{kind}_token_id"):
            failures.append(f"{kind} id")
    if (getattr(tokenizer, "chat_template", None) or None) != (getattr(rebuilt, "chat_template", None) or None):
        failures.append("chat template")
    return {"name": "tokenizer", "what": what, "measured": "identical" if not failures else "differs: " + ", ".join(failures),
            "tolerance": "identical", "outcome": FAILED if failures else PASSED, "passed": not failures, "verified": True}
