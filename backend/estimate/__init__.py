"""Memory estimator: a model's config.json + a RunConfig -> bytes per part of one training step.

Pure Python (standard library, pydantic and backend.core.config.run_config only): the studio imports it, so it must
never import torch or transformers. Every term is derived from the architecture in config.json,
read per family in the family's own key names with its config class's defaults (families.py:
Llama with Mistral, SmolLM and TinyLlama; Qwen2/2.5; Qwen3; Gemma 2; Gemma 3 text, also nested in
a multimodal gemma3 config's text_config, whose SigLIP tower is counted as frozen weights; Phi-3/4;
GPT-2's n_embd/n_layer/n_head/n_positions/n_inner; GPT-NeoX; Qwen2-MoE, Qwen3-MoE, Mixtral), and
from the run (method, precision, attention, checkpointing, optimizer, micro batch, sequence length,
ZeRO stage, number of GPUs). A model_type outside the table is estimated as a Llama-style decoder,
with a one-line note saying so; a config.json that cannot be read (missing, not JSON, a key that is
missing, a string, zero or negative, a multimodal config without a text part) is a one-line
ValueError naming the file, the key and the fix.

The specification of every part, its sources and assumptions is docs/architecture.md, "The
estimator's parts"; its measured accuracy is docs/benchmarks.md, "The estimate's accuracy".
"""

from __future__ import annotations

from backend.estimate.activations import activation_bytes, attention_kernel
from backend.estimate.architectures import (
    GPT_NEOX,
    LLAMA,
    PHI3,
    Arch,
    Dims,
    LayerKind,
    Linear,
    ParamCounts,
    all_linears,
    count_params,
    layer_kinds,
    layer_linears,
)
from backend.estimate.breakdown import (
    CUDA_PARTS, GIB, MIB, OBJECTIVE_PARTS, PARTS, VISION_PARTS, Breakdown, human_bytes,
)
from backend.estimate.cuda import ALLOCATOR_RESERVE, CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES
from backend.estimate.estimator import dora_transient, estimate
from backend.estimate.families import ESTIMATE_FAMILIES, load_model_config, read_dims
from backend.estimate.quantization import ADAM8_BLOCK, ADAM8_MIN_SIZE, NF4_BLOCK, NF4_DQ_BLOCK, nf4_bytes
from backend.estimate.setup import Setup, resolve_setup

ARCHITECTURES: dict[str, Arch] = {model_type: arch for model_type, (arch, _) in ESTIMATE_FAMILIES.items()}
"""config.json's model_type -> Arch (the measured families); others are estimated as Llama-style."""

__all__ = [
    "ADAM8_BLOCK",
    "ADAM8_MIN_SIZE",
    "ALLOCATOR_RESERVE",
    "ARCHITECTURES",
    "CUBLAS_WORKSPACE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "CUDA_PARTS",
    "ESTIMATE_FAMILIES",
    "GIB",
    "GPT_NEOX",
    "LLAMA",
    "MIB",
    "NF4_BLOCK",
    "NF4_DQ_BLOCK",
    "OBJECTIVE_PARTS",
    "VISION_PARTS",
    "PARTS",
    "PHI3",
    "Arch",
    "Breakdown",
    "Dims",
    "LayerKind",
    "Linear",
    "ParamCounts",
    "Setup",
    "activation_bytes",
    "all_linears",
    "attention_kernel",
    "count_params",
    "dora_transient",
    "estimate",
    "human_bytes",
    "layer_kinds",
    "layer_linears",
    "load_model_config",
    "nf4_bytes",
    "read_dims",
    "resolve_setup",
]
