"""What `finetune-studio serve` and the Serve panel offer: engines, devices, formats and the token's variable.

Torch-free, so the panel lists the same choices the CLI accepts without importing the serving code.
"""

from __future__ import annotations

from backend.core.registries.export_formats import EXPORT_FORMATS

TOKEN_ENV = "FINETUNE_STUDIO_API_TOKEN"
"""The token `serve` requires, when the caller (the panel) chooses it; else `serve` makes one."""
ENGINES = ("auto", "transformers", "vllm", "llama-cpp")
DEVICES = ("auto", "cpu", "cuda")
SERVED_FORMATS = tuple(f.name for f in sorted((f for f in EXPORT_FORMATS.values() if f.serve_order is not None),
                                             key=lambda f: f.serve_order))
"""Formats a server loads as they are (each entry's served_by and serve_order in export_formats.py; an adapter
is served on its base: backend/serving/source.py), in the order a run's exports are tried when no format is
named (source.py's ORDER): merged first (the trained model itself, every engine but llama.cpp); then the
calibrated compressed-tensors exports, which vLLM runs on integer kernels and transformers loads on the CPU
too, 8-bit before 4-bit as the tolerances rank them (w8a8 within +10% perplexity, gptq-int4 and awq-int4
within +25%); then bitsandbytes (plain rounding, slower in vLLM); GGUF last, for llama.cpp."""
