"""Memory estimator: a model's config.json + a RunConfig -> bytes per part of one training step.

Pure Python (standard library, pydantic and backend.config.run_config only): the studio imports it, so it must
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

The parts (each in bytes, each what that category holds at its own peak):

weights
    The frozen or trained model weights as stored: fp32 4 B, bf16/fp16 2 B, LLM.int8 1 B (+ one fp32
    scale per output row), NF4 0.5 B (+ quantization constants, see `nf4_bytes`), plus the rotary
    buffers. bitsandbytes quantizes nn.Linear modules only (GPT-2's Conv1D too); embeddings,
    lm_head, norms, biases, and MoE's fused experts and routers (3-D nn.Parameters, bitsandbytes
    issue #1849) stay unquantized: fp32 after prepare_model_for_kbit_training, else the compute
    dtype, except the fused experts, which the worker keeps in the compute dtype. For a MoE model under qlora/lora8 the estimate says so in a note, with the experts' size.
adapters
    LoRA A (r x in) and B (out x r) for every targeted linear, i.e. r*(in+out) parameters, plus the
    DoRA magnitude vector (out) per targeted linear; held in fp32 (PEFT's `autocast_adapter_dtype`).
    peft 0.21 turns `all-linear` on mixtral and qwen3_moe into target_parameters on the fused experts
    (gate_up at rank 2r, down at r, each A r*E x in and B out x r*E) and the router; on qwen2_moe it
    adapts the attention, the shared expert and its gate only (its conversion table lacks qwen2_moe).
gradients, optimizer, master_weights
    Model states after the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
    Training Trillion Parameter Models", section 3.1): mixed-precision Adam holds 2 B (bf16/fp16
    weights) + 2 B (gradients) + 4 B (fp32 master copy) + 4 B + 4 B (fp32 momentum and variance) =
    16 bytes per trained parameter, the seed article's "16Φ" (1.5B parameters -> 24 GB; GPT-2 XL's
    config.json gives 1.56 B parameters, 24.9 GB, which `finetune-studio estimate` prints); that is
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
    the way the Hugging Face implementations actually save them (activations.py, attention.py,
    mlp.py, saved.py). The method is that of Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", section 4.1), who count s*b*h*(34 + 5*a*s/h) bytes
    per GPT-3 layer in fp16; this module applies the same per-operation count to each family's
    layers (RMSNorm or Gemma's (1+w) RMSNorm, Gemma's four norms per layer, q/k norms, rotary
    embeddings, grouped-query attention, soft-capping, gated or GELU MLPs, GPT-2's Python gelu_new
    (four tensors), dropout masks where the config trains with dropout (GPT-2's 0.1 everywhere), the
    MoE router and its top-k experts, each routed token once per expert), in the run's dtype, so
    the constant differs from their 34. The 5*a*s/h term (the s x s attention scores and their
    softmax) exists only for eager attention (Gemma 2 runs only eager: transformers refuses SDPA for
    it) and for SDPA's math fallback (on CUDA in fp32 with grouped-query attention; on the CPU with
    attention dropout), see `attention_kernel`; SDPA's flash and memory-efficient kernels and
    FlashAttention-2 keep a log-sum-exp per query and head instead. Sliding-window layers whose
    window the sequence reaches give SDPA a 4-D mask, which torch saves per layer.
    With activation checkpointing (non-reentrant, every layer) each layer keeps only its input
    (s*b*h) plus the position ids (and the 4-D masks), and one layer is recomputed at a time in
    the backward pass, so the largest layer's activations come back on top.
logits
    The loss buffers: B*S*vocab elements of fp32 log-probabilities saved by cross-entropy, and, while
    its backward runs, the gradient of the log-probabilities and the gradient of the logits (fp32):
    12 bytes per element, more than the forward pass' logits (2 or 4 B) + log-probabilities (4 B)
    + transient fp32 upcast. Gemma 2's final soft-capping (tanh(logits/30)*30) saves tanh's output,
    one more logits-sized tensor. This follows the Trainer, which keeps only the loss, not the logits,
    for the backward pass. The worker projects only the positions whose next token is a target
    (backend/training/shortcuts/loss_positions.py), so the real buffer is (targets x vocab). Given the data's
    longest answer (`target_tokens`, which the studio's Data page measures), the estimate counts
    micro_batch x min(seq_len, target_tokens) positions, the most one micro-batch can hold; without
    it, every position, the worst case (raw text), which over-states instruction data by the
    prompts' share. With Liger every position goes through the fused loss, one chunk at a time.
runtime
    On CUDA: cuBLAS workspaces (the context and the allocator's reserve are parts of their own,
    below). On the CPU, given a calibration: the worker process's own
    resident memory before the model loads (Python, torch, transformers, the tokenized data),
    which a CPU worker's RSS holds besides the tensors; backend.api.calibration measures it from this
    machine's runs (backend.api.run_estimate passes it in). On either device the larger of the transients: the dequantized
    copy of the largest quantized linear (QLoRA / 8-bit), DoRA's weight-norm buffers (see
    `dora_transient`), and FSDP's foreach AdamW buffer (the worker's fused AdamW has none).

allocator_reserve, cuda_context (CUDA only; cuda.py)
    What the card holds beyond the allocated peak, so that the total is what a card must have:
    the caching allocator's reserve (cached blocks, rounding, fragmentation: a share of what a step
    allocates and frees, calibrated on two H200 measurements) and the CUDA context outside the
    allocator. cards.py says which common card sizes a total fits; seq_len.py the longest
    train.seq_len that fits a given memory (bisection over the total).

ref_model, ref_adapter, reference, generation (DPO, KTO and GRPO only; objectives.py)
    What TRL's trainers run beyond SFT's one pass: a frozen copy of a start adapter, the no-grad
    reference and KL passes, GRPO's generation (KV cache and prefill). With these objectives the
    activations are those of the rows TRL builds (DPO: chosen and rejected, 2 x micro_batch_size) and
    the logits part is TRL's fused LM head; bench/estimate_objectives.py measures them.

`total_bytes` is the step's peak: the largest of its phases (`details["peak_phases"]`: the start
of the backward pass; with checkpointing, the loss phase and the recompute phase, since the loss
buffers are freed before the first layer is recomputed; the end of the backward pass for a tied
embedding's two gradients; the optimizer step), plus the fixed runtime costs. `sum_bytes` is the
sum of the parts, an upper bound that holds every part at its own peak at once.

Where this differs from the published figures it was first checked against (the "seed" articles):
- The 16 bytes/parameter (and 24 GB for 1.5B parameters) agree exactly.
- The seed's "65B QLoRA fine-tune < 48 GB" is about the weights: NF4 with double quantization
  (block 64 for weights, 256 for constants) is 0.5 + 0.0159 bytes/parameter = 4.127 bits; here too.
  It holds for dense models only: a MoE model's fused experts are not quantized (see weights).
- The first seed's "activations of 1.5B GPT-2 at 1K tokens x batch 32 take about 60 GB" is the ZeRO
  paper's coarse count (12 x hidden values per token per layer, fp16: 12*1600*1024*32*48*2 B =
  60 GB). The per-operation count used here is larger for a classic GPT layer (Korthikanti's
  34 + 5as/h instead of 24, i.e. about 290 GB for that model with eager attention; GPT-2's
  gelu_new and dropout masks add more; on the CPU its attention dropout sends SDPA to the math
  kernel, which saves the s x s probabilities), and smaller for modern layers with SDPA/flash
  attention and no dropout. The studio's activations hover says why, per run.
- "Gradient checkpointing lowers activation memory from O(n) to O(sqrt(n))" holds for sqrt(n)
  checkpoint spacing; Hugging Face checkpoints every layer, which keeps n layer inputs + one layer, so
  the estimate uses that, not sqrt(n).
- "LoRA cuts VRAM by 2/3" is a rough saving on model states; activations are not cut by LoRA
  (frozen layers still keep what the adapters below them need) and are counted in full here. On
  mixtral and qwen3_moe, LoRA on the fused experts makes each layer hold a merged copy of its
  experts' weights for the backward pass, which can cost more than the adapters save.
- The FlashAttention memory figures quoted in the second article (96 GB vs 22 GB) are not
  reproduced: the estimate derives the s x s score term from the heads and sequence length instead.

Assumptions (where a real run can differ):
- bf16/fp16 runs follow the Hugging Face Trainer (the worker): the forward pass under
  torch.autocast, adapters in fp32 over a base loaded in bf16/fp16, full tuning over fp32 weights,
  QLoRA / 8-bit bases prepared by peft's prepare_model_for_kbit_training (which casts embeddings,
  lm_head, norms and MoE experts to fp32). `estimate(..., autocast=False)` models a model held in
  bf16/fp16 instead (DeepSpeed's way; then each adapted linear saves a 4-byte copy of its input).
- SDPA runs without a padding mask (packed or unpadded batches: the flash / memory-efficient
  kernels); a padding mask can make torch fall back to a kernel that expands K/V to all heads.
  Packed rows really do run without one: the worker's `sdpa_packed` attends per example and builds
  no block-diagonal mask (backend/training/shortcuts/packed_attention.py), except for windowed models
  (sliding_window set), which it hands to transformers' masks: counted, per layer.
- Every sequence is `train.seq_len` long (the worst case). With packing (the default) a micro-batch is
  one row of up to micro_batch_size x seq_len tokens. FlashAttention-2 and the worker's sdpa_packed
  attend per example, so their s x s terms are per example and linear in the micro-batch; eager
  attention (and SDPA where sdpa_packed does not apply: shortcuts off, torch.compile, sliding
  windows) sees the whole row, so its score matrix and 4-D mask grow with the square of that row.
- NEFTune, packing and LoRA dropout 0 add no saved tensors; LoRA dropout > 0 adds a mask-sized copy
  of each adapted input, counted.
- MoE experts run transformers' default `grouped_mm` experts implementation (one grouped matmul per
  projection over the tokens sorted by expert); the eager per-expert loop is not modelled. The
  load-balancing loss (output_router_logits) adds a softmax per MoE layer.
- ZeRO stage 3 keeps two layers' gathered weights on each GPU (the one computing and the prefetched
  one); DDP (num_gpus > 1, stage 0) keeps a second copy of the gradients in its buckets
  (gradient_as_bucket_view off, the default). FSDP, tensor and pipeline parallelism are not modelled.

Accuracy: bench/estimate_accuracy.py measures every part on 115 configurations across all twelve
families of the table (tiny random-weight models; LoRA, DoRA, QLoRA, LLM.int8, full; checkpointing
on/off; eager/SDPA; fp32/bf16, with and without autocast): on the CPU weights, adapters, gradients,
optimizer and logits to the byte and activations within 2.2% for every family but GPT-2 with DoRA
(-6.2%); the total (the largest phase) came within 3% of the step's measured peak in 114 of 115
(-9% for GPT-NeoX DoRA with checkpointing), where the sum of the parts overshot by up to 34%.
Parameter counts equal transformers' for every published config.json in
tests/fixtures/model_configs. Earlier, on an H200 (39 configurations of Llama, GPT-NeoX, Qwen2,
Phi-3): every part within 6% (LLM.int8 with checkpointing being the 6%), and the phase-by-phase
peak within 3% of torch.cuda.max_memory_allocated for most configurations (8-17% low for
LLM.int8, whose CUDA kernels' scratch buffers are not modelled, and 15% high for DoRA). The new
families are not yet measured on CUDA. Figures and commands: docs/benchmarks.md.
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
from backend.estimate.breakdown import CUDA_PARTS, GIB, MIB, OBJECTIVE_PARTS, PARTS, Breakdown, human_bytes
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
