"""What `finetune-studio serve` and the Serve panel offer: engines, devices, formats and the token's variable.

Torch-free, so the panel lists the same choices the CLI accepts without importing the serving code.
"""

from __future__ import annotations

from backend.api.export_formats import GGUF_TYPES

TOKEN_ENV = "FINETUNE_STUDIO_API_TOKEN"
"""The token `serve` requires, when the caller (the panel) chooses it; else `serve` makes one."""
ENGINES = ("auto", "transformers", "vllm", "llama-cpp")
DEVICES = ("auto", "cpu", "cuda")
SERVED_FORMATS = ("merged", "bnb-8bit", "bnb-4bit", *GGUF_TYPES)
"""Formats a server loads as they are (an adapter is served on its base: backend/serving/source.py)."""
