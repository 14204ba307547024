"""Memory estimator: a model's config.json + a RunConfig -> bytes per part of one training step.

Pure Python (standard library, pydantic and backend.config only): the studio imports it, so it must
never import torch or transformers. Every term is derived from the architecture in config.json
(hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
head_dim, vocab_size, tie_word_embeddings) and from the run (method, precision, attention,
checkpointing, optimizer, micro batch, sequence length, ZeRO stage, number of GPUs).

The parts (each in bytes, each what that category holds at its own peak):

weights
    The frozen or trained model weights as stored: fp32 4 B, bf16/fp16 2 B, LLM.int8 1 B (+ one fp32
    scale per output row), NF4 0.5 B (+ quantization constants, see `nf4_bytes`), plus the rotary
    buffers. bitsandbytes quantizes the decoder linears only; embeddings, lm_head, norms and biases
    stay unquantized (fp32 after prepare_model_for_kbit_training, else the compute dtype).
adapters
    LoRA A (r x in) and B (out x r) for every targeted linear, i.e. r*(in+out) parameters, plus the
    DoRA magnitude vector (out) per targeted linear; held in fp32 (PEFT's `autocast_adapter_dtype`).
gradients, optimizer, master_weights
    Model states after the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models", section 3.1): mixed-precision Adam holds 2 B (bf16/fp16
    weights) + 2 B (gradients) + 4 B (fp32 master copy) + 4 B + 4 B (fp32 momentum and variance) =
    16 bytes per trained parameter, the seed article's "16Φ" (1.5B parameters -> 24 GB); that is
    the split with DeepSpeed or `autocast=False`. The Trainer's autocast recipe (the default) keeps
    fp32 weights and gradients instead: 4 + 4 + 8 = 16 bytes too, no separate master copy, plus a
    bf16 copy of each weight that autocast saves for the backward pass (2 bytes, counted under
    activations). In fp32 the same 4 + 4 + 8 = 16. Adapters are already fp32, so LoRA has no master
    copy. torch's AdamW also keeps a 4-byte `step` per
    trained tensor. 8-bit Adam (bitsandbytes) keeps both states in 8 bits: 2 B per parameter plus one
    fp32 absmax per 256-element block and state; tensors under 4096 elements stay fp32. ZeRO stage 1
    divides optimizer state and master weights by the number of GPUs, stage 2 the gradients too,
    stage 3 the weights too (ZeRO paper, table 1).
activations
    Every tensor autograd saves for the backward pass while the forward pass runs, counted per storage
    the way the Hugging Face implementations actually save them (see `_layer_saved`). The method is that
    of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    section 4.1), who count s*b*h*(34 + 5*a*s/h) bytes per GPT-3 layer in fp16; this module applies the
    same per-operation count to Llama-style layers (RMSNorm, rotary embeddings, grouped-query
    attention, gated MLP, no dropout) and GPT-NeoX layers (LayerNorm, fused QKV, GELU MLP), in the
    run's dtype, so the constant differs from their 34. The 5*a*s/h term (the s x s attention scores
    and their softmax) exists only for eager attention (and for SDPA's math fallback, which torch
    takes on CUDA in fp32 with grouped-query attention, see `attention_kernel`); SDPA's flash and
    memory-efficient kernels and FlashAttention-2 keep a log-sum-exp per query and head instead.
    With activation checkpointing (non-reentrant, every layer) each layer keeps only its input
    (s*b*h) plus the position ids (and eager's 4-D mask), and one layer is recomputed at a time in
    the backward pass, so one layer's activations come back on top.
logits
    The loss buffers: B*S*vocab elements of fp32 log-probabilities saved by cross-entropy, and, while
    its backward runs, the gradient of the log-probabilities and the gradient of the logits (fp32):
    12 bytes per element, more than the forward pass' logits (2 or 4 B) + log-probabilities (4 B)
    + transient fp32 upcast. This follows the Trainer, which keeps only the loss, not the logits,
    for the backward pass. The worker projects only the positions whose next token is a target
    (backend/training/loss_positions.py), so the real buffer is (targets x vocab). Given the data's
    longest answer (`target_tokens`, which the studio's Data page measures), the estimate counts
    micro_batch x min(seq_len, target_tokens) positions, the most one micro-batch can hold; without
    it, every position, the worst case (raw text), which over-states instruction data by the
    prompts' share. With Liger every position goes through the fused loss, one chunk at a time.
runtime
    On CUDA: the CUDA context (outside PyTorch's allocator), cuBLAS workspaces, the dequantized copy of
    the largest quantized linear (QLoRA / 8-bit), DoRA's weight-norm buffers (see `dora_transient`)
    and an allocator allowance for fragmentation. Zero on CPU.

`total_bytes` is the sum of the parts: an upper bound that treats every part as held at once (in
full fine-tuning the gradients grow while the activations are freed, so the real peak is a little
lower; `details["peak_phases"]` gives the tighter phase-by-phase figure).

Where this differs from the seed articles (shared/seeds):
- The 16 bytes/parameter (and 24 GB for 1.5B parameters) agree exactly.
- The seed's "65B QLoRA fine-tune < 48 GB" is about the weights: NF4 with double quantization
  (block 64 for weights, 256 for constants) is 0.5 + 0.0159 bytes/parameter = 4.127 bits; here too.
- The first seed's "activations of 1.5B GPT-2 at 1K tokens x batch 32 take about 60 GB" is the ZeRO
  paper's coarse count (12 x hidden values per token per layer, fp16: 12*1600*1024*32*48*2 B =
  60 GB). The per-operation count used here is larger for a classic GPT layer (Korthikanti's
  34 + 5as/h instead of 24, i.e. about 290 GB for that model with eager attention), and smaller for
  modern layers with SDPA/flash attention and no dropout.
- "Gradient checkpointing lowers activation memory from O(n) to O(sqrt(n))" holds for sqrt(n)
  checkpoint spacing; Hugging Face checkpoints every layer, which keeps n layer inputs + one layer, so
  the estimate uses that, not sqrt(n).
- "LoRA cuts VRAM by 2/3" is a rough saving on model states; activations are not cut by LoRA
  (frozen layers still keep what the adapters below them need) and are counted in full here.
- The FlashAttention memory figures quoted in the second article (96 GB vs 22 GB) are not
  reproduced: the estimate derives the s x s score term from the heads and sequence length instead.

Assumptions (where a real run can differ):
- bf16/fp16 runs follow the Hugging Face Trainer (the worker): the forward pass under
  torch.autocast, adapters in fp32 over a base loaded in bf16/fp16, full tuning over fp32 weights,
  QLoRA / 8-bit bases prepared by peft's prepare_model_for_kbit_training (which casts embeddings,
  lm_head and norms to fp32). `estimate(..., autocast=False)` models a model held in bf16/fp16
  instead (DeepSpeed's way; then each adapted linear saves a 4-byte copy of its input).
- SDPA runs without a padding mask (packed or unpadded batches: the flash / memory-efficient
  kernels); a padding mask can make torch fall back to a kernel that expands K/V to all heads.
  Packed rows really do run without one: the worker's `sdpa_packed` attends per example and builds
  no block-diagonal mask (backend/training/packed_attention.py).
- Every sequence is `train.seq_len` long (the worst case). With packing (the default) a micro-batch is
  one row of up to micro_batch_size x seq_len tokens, so the eager score matrix and the 4-D mask grow
  with the square of that row; set packing off (or use FlashAttention-2's varlen path) to avoid it.
- NEFTune, packing and LoRA dropout 0 add no saved tensors; LoRA dropout > 0 adds a mask-sized copy
  of each adapted input, counted.
- ZeRO stage 3 keeps two layers' gathered weights on each GPU (the one computing and the prefetched
  one); DDP (num_gpus > 1, stage 0) keeps a second copy of the gradients in its buckets
  (gradient_as_bucket_view off, the default). FSDP, tensor and pipeline parallelism are not modelled.

Accuracy: bench/estimate_accuracy.py measures every part on 39 configurations (Llama, GPT-NeoX,
Qwen2, Phi-3; LoRA, DoRA, QLoRA, LLM.int8, full; checkpointing on/off; eager/SDPA; fp32/bf16, with
and without autocast): every part within 1.3% on the CPU and within 6% on an H200 (LLM.int8 with
checkpointing being the 6%), where the phase-by-phase peak also came within 3% of
torch.cuda.max_memory_allocated for most configurations (8-17% low for LLM.int8, whose CUDA
kernels' scratch buffers are not modelled, and 15% high for DoRA).
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
from backend.estimate.breakdown import GIB, MIB, PARTS, Breakdown, human_bytes
from backend.estimate.estimator import (
    ALLOCATOR_SLACK,
    CUBLAS_WORKSPACE_BYTES,
    CUDA_CONTEXT_BYTES,
    dora_transient,
    estimate,
)
from backend.estimate.families import FAMILIES, load_model_config, read_dims
from backend.estimate.quantization import ADAM8_BLOCK, ADAM8_MIN_SIZE, NF4_BLOCK, NF4_DQ_BLOCK, nf4_bytes
from backend.estimate.setup import Setup, resolve_setup

ARCHITECTURES: dict[str, Arch] = {model_type: arch for model_type, (arch, _) in FAMILIES.items()}
"""config.json's model_type -> Arch (the measured families); others are estimated as Llama-style."""

__all__ = [
    "ADAM8_BLOCK",
    "ADAM8_MIN_SIZE",
    "ALLOCATOR_SLACK",
    "ARCHITECTURES",
    "CUBLAS_WORKSPACE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "FAMILIES",
    "GIB",
    "GPT_NEOX",
    "LLAMA",
    "MIB",
    "NF4_BLOCK",
    "NF4_DQ_BLOCK",
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
