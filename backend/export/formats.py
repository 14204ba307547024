"""The export formats, their loaders and the tolerances their checks use. Torch-free.

The CLI builds its `--format` choices from FORMATS and the studio can list them without importing
torch; backend/jobs/export.py and backend/export/verify.py read the tolerances from here so that the
report, the docs and the code state the same numbers (docs/export.md explains how they were chosen).
"""

from __future__ import annotations

FORMATS: dict[str, str] = {
    "adapter": "the PEFT adapter folder; load it with peft on top of the base model",
    "merged": "adapter merged into a 16-bit copy of the base (safetensors); load it with transformers",
    "bnb-8bit": "merged model quantized with bitsandbytes LLM.int8; transformers loads it 8-bit",
    "bnb-4bit": "merged model quantized with bitsandbytes NF4; transformers loads it 4-bit",
    "gguf-f16": "GGUF, 16-bit weights, for llama.cpp and Ollama",
    "gguf-q8_0": "GGUF, 8-bit Q8_0 weights (about 1.06 bytes/parameter), for llama.cpp and Ollama",
    "gguf-q5_0": "GGUF, 5-bit Q5_0 weights (about 0.69 bytes/parameter), for llama.cpp and Ollama",
    "gguf-q4_0": "GGUF, 4-bit Q4_0 weights (about 0.56 bytes/parameter), for llama.cpp and Ollama",
}

GGUF_TYPES: dict[str, str] = {"gguf-f16": "F16", "gguf-q8_0": "Q8_0", "gguf-q5_0": "Q5_0", "gguf-q4_0": "Q4_0"}
"""GGUF format -> the GGML type of its 2-D weights (1-D tensors stay F32, odd rows F16)."""

GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3",
    "phi3": "phi3", "gpt2": "gpt2", "gpt_neox": "gptneox",
}
"""Hugging Face model_type -> llama.cpp architecture written (backend/export/gguf_families.py has the
details); anything else is refused. SmolLM, TinyLlama and Llama 2/3 are model_type llama."""

DTYPES = ("bf16", "fp16")

# --- tolerances (measured figures and reasons: docs/export.md) ---------------------------------

LOGIT_TOLERANCE: dict[str, float] = {
    "adapter": 1e-4,   # the same tensors reloaded: only float summation order may differ
    "merged:fp16": 1e-2,
    "merged:bf16": 1e-1,  # bf16 keeps 8 significant bits: 1e-2 is below its own rounding (see docs)
    "gguf-f16": 3e-2,  # read back by transformers and computed in fp16: F16 weights plus fp16 activations
    "gguf-f16:bf16": 1e-1,  # an F16 GGUF of Gemma, computed in bf16 (fp16 overflows Gemma's activations)
}
"""Largest allowed |logit difference| against the trained model (base + adapter, fp32)."""

PERPLEXITY_TOLERANCE: dict[str, float] = {
    "bnb-8bit": 0.05,
    "bnb-4bit": 0.25,
    "gguf-q8_0": 0.05,
    "gguf-q5_0": 0.15,
    "gguf-q4_0": 0.25,
}
"""Largest allowed relative perplexity increase over the trained model's (0.05 = +5%)."""


def is_gguf(fmt: str) -> bool:
    return fmt in GGUF_TYPES
