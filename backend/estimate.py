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
    for the backward pass.
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

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from backend.config import RunConfig
from backend.paths import BUNDLED_PREFIX, resolve_resource

PARTS = ("weights", "adapters", "gradients", "optimizer", "master_weights", "activations", "logits", "runtime")
"""The parts of a Breakdown, in display order."""

GIB = 1 << 30
MIB = 1 << 20

CUDA_CONTEXT_BYTES = 768 * MIB
"""CUDA context and loaded kernels per GPU, outside PyTorch's allocator: 750-835 MiB measured on an
H200 with CUDA 13 and torch 2.11 (the upper end with bitsandbytes loaded); older stacks use less."""
CUBLAS_WORKSPACE_BYTES = 64 * MIB
"""cuBLAS / cuBLASLt workspaces, allocated once through PyTorch's caching allocator (64 MiB seen
on an H200)."""
ALLOCATOR_SLACK = 0.05
"""Allowance for allocator fragmentation: this share of the part that changes every step.
(The first seed article warns that fragmentation can waste up to 30% in extreme cases.)"""

NF4_BLOCK = 64
"""NF4 block size for weights (QLoRA paper, Dettmers et al. 2023): one absmax per 64 weights."""
NF4_DQ_BLOCK = 256
"""Double quantization: the absmaxes are quantized to 8 bits in blocks of 256, one fp32 each."""
ADAM8_BLOCK = 256
"""bitsandbytes 8-bit Adam: block-wise quantization with one fp32 absmax per 256 values per state."""
ADAM8_MIN_SIZE = 4096
"""bitsandbytes keeps 32-bit state for tensors with fewer elements than this (min_8bit_size)."""


# --- architectures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """What the estimator needs to know about a model family beyond config.json's numbers."""

    family: str
    norm: Literal["rms", "layer"]
    gated_mlp: bool
    fused_qkv: bool
    fused_gate_up: bool
    parallel_residual: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    names: dict[str, str]
    """Module names of the roles q, k, v (or qkv), o, gate, up (or gate_up), down / fc1, fc2."""
    query_layout_bshd: bool
    """Whether the rotated query keeps the (batch, seq, heads, dim) memory layout of the projection,
    so SDPA's output is already contiguous for o_proj (Llama) or is copied again (GPT-NeoX's cat)."""
    measured: bool
    """Checked against real tensors in bench/estimate_accuracy.py."""


LLAMA = Arch(
    family="llama",
    norm="rms",
    gated_mlp=True,
    fused_qkv=False,
    fused_gate_up=False,
    parallel_residual=False,
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj", "down": "down_proj"},
    query_layout_bshd=True,
    measured=True,
)
GPT_NEOX = Arch(
    family="gpt_neox",
    norm="layer",
    gated_mlp=False,
    fused_qkv=True,
    fused_gate_up=False,
    parallel_residual=True,
    qkv_bias=True,
    o_bias=True,
    mlp_bias=True,
    names={"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    query_layout_bshd=False,
    measured=True,
)
PHI3 = Arch(
    family="phi3",
    norm="rms",
    gated_mlp=True,
    fused_qkv=True,
    fused_gate_up=True,
    parallel_residual=False,
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    names={"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj"},
    query_layout_bshd=False,
    measured=False,
)

ARCHITECTURES: dict[str, Arch] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": Arch(**{**LLAMA.__dict__, "family": "qwen2", "qkv_bias": True}),
    "gpt_neox": GPT_NEOX,
    "phi3": PHI3,
}
"""config.json's model_type -> Arch. Unknown types are estimated as Llama-style, with a warning."""


@dataclass(frozen=True)
class Dims:
    """The numbers read from config.json."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    rotary_dim: int
    parallel_residual: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    act: str

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def load_model_config(model_config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """config.json as a dict, from a dict, a folder holding config.json, the file, or `bundled:NAME`."""
    if isinstance(model_config, dict):
        return model_config
    text = str(model_config)
    path = resolve_resource(text) if text.startswith(BUNDLED_PREFIX) else Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no config.json; point model.path at a Hugging Face model folder") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return raw


def read_dims(raw: dict[str, Any]) -> tuple[Arch, Dims, list[str]]:
    """The architecture family and numbers of a config.json dict, plus warnings."""
    warnings: list[str] = []
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        raw = {**raw["text_config"], "model_type": raw["text_config"].get("model_type", raw.get("model_type"))}
    model_type = str(raw.get("model_type", "llama"))
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        warnings.append(f"model_type {model_type!r} is not in the architecture table; estimated as a Llama-style decoder")
        arch = LLAMA
    elif not arch.measured:
        warnings.append(f"{model_type}: derived from the same rules, not measured against real tensors")

    def need(key: str) -> int:
        value = raw.get(key)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.json: {key} is missing or not a positive integer")
        return value

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    layers = need("num_hidden_layers")
    vocab = need("vocab_size")
    intermediate = raw.get("intermediate_size") or 4 * hidden
    kv_heads = raw.get("num_key_value_heads") or heads
    head_dim = raw.get("head_dim") or hidden // heads
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    factor = raw.get("rotary_pct", raw.get("partial_rotary_factor", None))
    if factor is None and isinstance(rope, dict):
        factor = rope.get("partial_rotary_factor")
    if factor is None:
        factor = 1.0
    rotary_dim = int(head_dim * float(factor))
    tied = bool(raw.get("tie_word_embeddings", False))
    parallel = bool(raw.get("use_parallel_residual", arch.parallel_residual)) if arch.family == "gpt_neox" else arch.parallel_residual
    if arch.family == "gpt_neox":
        qkv_bias = o_bias = bool(raw.get("attention_bias", True))
        mlp_bias = True
    elif arch.family == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(raw.get("attention_bias", arch.qkv_bias))
        mlp_bias = bool(raw.get("mlp_bias", arch.mlp_bias))
    act = str(raw.get("hidden_act", "silu" if arch.gated_mlp else "gelu"))
    if act in ("gelu_new", "gelu_fast", "quick_gelu"):
        warnings.append(f"hidden_act {act}: its Python implementation saves a few more tensors than counted")
    dims = Dims(
        model_type=model_type,
        hidden=hidden,
        intermediate=int(intermediate),
        layers=layers,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab=vocab,
        tied=tied,
        rotary_dim=rotary_dim,
        parallel_residual=parallel,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        act=act,
    )
    return arch, dims, warnings


@dataclass(frozen=True)
class Linear:
    role: str
    name: str
    inp: int
    out: int
    bias: bool


def layer_linears(arch: Arch, d: Dims) -> list[Linear]:
    """The linear layers of one decoder layer (in forward order)."""
    n = arch.names
    out: list[Linear] = []
    if arch.fused_qkv:
        out.append(Linear("qkv", n["qkv"], d.hidden, d.q_dim + 2 * d.kv_dim, d.qkv_bias))
    else:
        out.append(Linear("q", n["q"], d.hidden, d.q_dim, d.qkv_bias))
        out.append(Linear("k", n["k"], d.hidden, d.kv_dim, d.qkv_bias))
        out.append(Linear("v", n["v"], d.hidden, d.kv_dim, d.qkv_bias))
    out.append(Linear("o", n["o"], d.q_dim, d.hidden, d.o_bias))
    if arch.gated_mlp:
        if arch.fused_gate_up:
            out.append(Linear("gate_up", n["gate_up"], d.hidden, 2 * d.intermediate, d.mlp_bias))
        else:
            out.append(Linear("gate", n["gate"], d.hidden, d.intermediate, d.mlp_bias))
            out.append(Linear("up", n["up"], d.hidden, d.intermediate, d.mlp_bias))
        out.append(Linear("down", n["down"], d.intermediate, d.hidden, d.mlp_bias))
    else:
        out.append(Linear("fc1", n["fc1"], d.hidden, d.intermediate, d.mlp_bias))
        out.append(Linear("fc2", n["fc2"], d.intermediate, d.hidden, d.mlp_bias))
    return out


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by kind, for the whole model."""

    linear_weights: int
    """Decoder linears' weight matrices (what bitsandbytes quantizes)."""
    linear_biases: int
    norms: int
    embedding: int
    lm_head: int
    """Zero when tied to the embedding."""
    linear_tensors: int
    other_tensors: int
    largest_linear: int

    @property
    def total(self) -> int:
        return self.linear_weights + self.linear_biases + self.norms + self.embedding + self.lm_head

    @property
    def tensors(self) -> int:
        return self.linear_tensors + self.other_tensors


def count_params(arch: Arch, d: Dims) -> ParamCounts:
    """Parameters derived from the architecture (matches model.num_parameters() for the table's types)."""
    lins = layer_linears(arch, d)
    lw = sum(l.inp * l.out for l in lins) * d.layers
    lb = sum(l.out for l in lins if l.bias) * d.layers
    per_norm = d.hidden * (2 if arch.norm == "layer" else 1)
    norms = per_norm * (2 * d.layers + 1)
    lin_tensors = d.layers * sum(2 if l.bias else 1 for l in lins)
    norm_tensors = (2 * d.layers + 1) * (2 if arch.norm == "layer" else 1)
    other = norm_tensors + 1 + (0 if d.tied else 1)
    return ParamCounts(
        linear_weights=lw,
        linear_biases=lb,
        norms=norms,
        embedding=d.vocab * d.hidden,
        lm_head=0 if d.tied else d.vocab * d.hidden,
        linear_tensors=lin_tensors,
        other_tensors=other,
        largest_linear=max(l.inp * l.out for l in lins),
    )


def nf4_bytes(numel: int, double_quant: bool = True) -> dict[str, int]:
    """Bytes of one NF4 tensor in bitsandbytes: packed 4-bit data and its quantization constants.

    Data: two weights per byte. Constants: one absmax per 64 weights, fp32 (0.5 bit/weight), or
    with double quantization 8-bit absmaxes plus one fp32 per 256 of them (8/64 + 32/(64*256) =
    0.127 bit/weight, the QLoRA paper's figure), plus the 16-value NF4 code (and the 256-value
    code of the second level).
    """
    blocks = math.ceil(numel / NF4_BLOCK)
    data = math.ceil(numel / 2)
    if double_quant:
        blocks2 = math.ceil(blocks / NF4_DQ_BLOCK)
        constants = blocks + 4 * blocks2 + 4 + 256 * 4 + 16 * 4
    else:
        constants = 4 * blocks + 16 * 4
    return {"data": data, "constants": constants}


# --- the run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """The run's choices, resolved for one device."""

    method: str
    e: int
    """Compute dtype bytes (weights and activations)."""
    dtype: str
    adapter_e: int
    full: bool
    quant: str | None  # "nf4" | "int8" | None
    rank: int
    dropout: bool
    targets: frozenset[str]
    """Roles (q, k, v, qkv, o, gate, up, gate_up, down, fc1, fc2, lm_head) that get adapters."""
    attention: str  # eager | sdpa | flash_attention_2
    checkpointing: bool
    batch: int
    seq: int
    device: str
    autocast: bool = False
    """The forward pass runs under torch.autocast (what the Trainer does with bf16/fp16 on)."""
    w_e: int = 0
    """Bytes per element of the unquantized weights as loaded (fp32 for full tuning under autocast
    and for the non-quantized parts of a k-bit model prepared by peft, else the compute dtype)."""
    r_e: int = 0
    """Bytes per element of the hidden states between layers (the embedding's dtype)."""

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def adapted(self) -> bool:
        return self.method in ("lora", "dora", "qlora", "lora8")


_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def resolve_setup(
    arch: Arch, d: Dims, run: RunConfig, device: str, bf16_supported: bool, autocast: bool | None = None, deepspeed: bool = False
) -> tuple[Setup, list[str]]:
    t = run.technique
    warnings: list[str] = []
    dtype = t.precision
    if dtype == "auto":
        dtype = "fp32" if device == "cpu" else ("bf16" if bf16_supported else "fp16")
    attention = t.attention
    if attention == "auto":
        attention = "sdpa"
    if attention == "flash_attention_2" and device == "cpu":
        warnings.append("flash_attention_2 needs CUDA; estimated as sdpa")
        attention = "sdpa"
    names = {l.name: l.role for l in layer_linears(arch, d)}
    roles = set(names.values())
    if t.lora_targets.strip() == "all-linear":
        targets = set(roles)
    else:
        targets = set()
        for item in (s.strip() for s in t.lora_targets.split(",")):
            if not item:
                continue
            if item in names:
                targets.add(names[item])
            elif item == "lm_head":
                targets.add("lm_head")
            else:
                warnings.append(f"technique.lora_targets: {item!r} is not a linear of {d.model_type}; ignored")
    quant = {"qlora": "nf4", "lora8": "int8"}.get(t.method)
    e = _DTYPE_BYTES[dtype]
    if autocast is None:
        # The Trainer's recipe (what backend/jobs/finetune.py runs): bf16/fp16 through autocast,
        # unless DeepSpeed holds the model in that dtype itself.
        autocast = not deepspeed
    autocast = autocast and e != 4
    if autocast and (t.method == "full" or quant):
        # full: fp32 weights, autocast computes in bf16/fp16 (no separate master copy);
        # k-bit: peft's prepare_model_for_kbit_training casts the unquantized weights to fp32.
        w_e = r_e = 4
    else:
        w_e = r_e = e
    setup = Setup(
        method=t.method,
        e=e,
        dtype=dtype,
        adapter_e=4,
        full=t.method == "full",
        quant=quant,
        rank=t.lora_rank,
        dropout=t.lora_dropout > 0,
        targets=frozenset(targets) if t.method != "full" else frozenset(),
        attention=attention,
        checkpointing=t.gradient_checkpointing,
        # Packing turns a micro-batch into one row of up to micro_batch x seq_len tokens: the same
        # tokens, but the attention scores (eager) and the 4-D mask scale with that row's length.
        batch=1 if t.packing else run.train.micro_batch_size,
        seq=run.train.seq_len * (run.train.micro_batch_size if t.packing else 1),
        device=device,
        autocast=autocast,
        w_e=w_e,
        r_e=r_e,
    )
    return setup, warnings


# --- activations ----------------------------------------------------------------------------


class _Saved:
    """Named storages saved for backward; a name saved twice is one storage (counted once)."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.ctx_held: set[str] = set()
        """Keys a custom autograd Function keeps as a ctx attribute (bitsandbytes' int8 matmul), which
        activation checkpointing cannot drop."""

    def put(self, key: str, nbytes: int) -> None:
        self.items.setdefault(key, int(nbytes))

    def total(self, without: set[str] | None = None) -> int:
        return sum(v for k, v in self.items.items() if not without or k not in without)


def _linear(saved: _Saved, s: Setup, lin: Linear, inp_key: str, inp_e: int, inp_grad: bool) -> int:
    """What one linear saves; returns its output's bytes per element.

    A trained weight needs its input (dW = dY^T X); a frozen one needs only itself (a parameter).
    Under autocast the input is first cast to the compute dtype (a copy per linear, saved instead
    of the shared input) and so is a weight of another dtype (the cast copy, saved when the input
    needs a gradient: 2 bytes per parameter held through the backward pass). bitsandbytes' 4-bit
    matmul saves nothing but its weight and returns the input's dtype; its 8-bit training path on the
    CPU (MatMul8bitFp) keeps its input as a ctx attribute, always, even under checkpointing; on CUDA
    (H200, bitsandbytes 0.50.2) the 8-bit linears were measured to add no saved activations.

    An adapter saves its input (a copy in the adapter's dtype when that differs from the compute
    dtype, or under autocast a copy in the compute dtype, one per adapted linear) and the r-wide A
    output; under autocast also the compute-dtype copies of A and B. LoRA dropout adds its mask
    (bool on CUDA, the input's dtype on CPU). DoRA also saves the base output and the LoRA output
    (out wide each) and three out-sized vectors."""
    T, c = s.tokens, s.e
    quantized = s.quant is not None and lin.role != "lm_head"
    if s.full:
        if s.autocast and inp_e != c:
            saved.put(f"{lin.name}.in_c", T * lin.inp * c)
        else:
            saved.put(inp_key, T * lin.inp * inp_e)
        if s.autocast and s.w_e != c and inp_grad:
            saved.put(f"{lin.name}.weight_c", lin.inp * lin.out * c)
        out_e = c if s.autocast else s.w_e
    elif quantized:
        out_e = inp_e
        if s.quant == "int8" and s.device == "cpu":
            saved.put(inp_key, T * lin.inp * inp_e)
            saved.ctx_held.add(inp_key)
            out_e = c if s.autocast else inp_e  # MatMul8bitFp dequantizes and calls F.linear
    else:
        if s.autocast and s.w_e != c and inp_grad:
            saved.put(f"{lin.name}.weight_c", lin.inp * lin.out * c)
        out_e = c if s.autocast else s.w_e
    if lin.role in s.targets:
        ae = s.adapter_e
        mask_e = 1 if s.device == "cuda" else ae
        if s.autocast:
            if s.dropout and inp_grad:
                saved.put(f"{lin.name}.dropout_mask", T * lin.inp * mask_e)
            saved.put(f"{lin.name}.in_c", T * lin.inp * c)
            saved.put(f"{lin.name}.lora_mid", T * s.rank * c)
            if inp_grad:
                saved.put(f"{lin.name}.lora_A_c", s.rank * lin.inp * c)
            saved.put(f"{lin.name}.lora_B_c", lin.out * s.rank * c)
            adapter_out_e = c
        else:
            if s.dropout:
                # the dropped copy feeds lora_A (the mask only when the input needs a gradient)
                saved.put(f"{lin.name}.dropout_in", T * lin.inp * ae)
                if inp_grad:
                    saved.put(f"{lin.name}.dropout_mask", T * lin.inp * mask_e)
            elif ae == inp_e:
                saved.put(inp_key, T * lin.inp * inp_e)
            else:
                saved.put(f"{lin.name}.in_{ae}", T * lin.inp * ae)
            saved.put(f"{lin.name}.lora_mid", T * s.rank * ae)
            adapter_out_e = ae
        if s.method == "dora":
            saved.put(f"{lin.name}.dora_base", T * lin.out * out_e)
            saved.put(f"{lin.name}.dora_lora", T * lin.out * adapter_out_e)
            saved.put(f"{lin.name}.dora_vectors", 3 * lin.out * 4)
    return out_e


def _norm(saved: _Saved, arch: Arch, d: Dims, s: Setup, name: str, x_key: str, x_e: int, x_grad: bool) -> int:
    """What a norm saves; returns its output's bytes per element.

    RMSNorm (HF): upcasts x to fp32 and saves it (x itself when already fp32), saves rsqrt (one
    fp32 per token) and, when its weight is trained, the normalized x in x's dtype; the output takes
    the wider of the weight's and x's dtypes. LayerNorm (native_layer_norm): saves x and a mean and
    rstd per token (fp32 on CUDA, x's dtype on CPU); under CUDA autocast it runs in fp32 (x is
    upcast, a saved copy, and the output is fp32)."""
    T = s.tokens
    if arch.norm == "rms":
        if x_grad:
            saved.put(x_key if x_e == 4 else f"{name}.x32", T * d.hidden * 4)
            saved.put(f"{name}.rstd", T * 4)
        if s.full:
            saved.put(f"{name}.normed", T * d.hidden * x_e)
        return max(s.w_e, x_e)
    if not (x_grad or s.full):
        return max(s.w_e, x_e) if not (s.autocast and s.device == "cuda") else 4
    if s.autocast and s.device == "cuda":
        saved.put(x_key if x_e == 4 else f"{name}.x32", T * d.hidden * 4)
        saved.put(f"{name}.stats", 2 * T * 4)
        return 4
    saved.put(x_key, T * d.hidden * x_e)
    saved.put(f"{name}.stats", 2 * T * (4 if s.device == "cuda" else x_e))
    return max(s.w_e, x_e)


def attention_kernel(d: Dims, s: Setup) -> str:
    """The kernel that actually runs: eager; flash (FlashAttention-2, SDPA's flash kernel on CUDA
    in bf16/fp16, SDPA's CPU kernel); efficient (SDPA on CUDA in fp32, which flash does not support);
    math (SDPA on CUDA in fp32 with grouped-query attention, which the efficient kernel does not
    support: torch falls back to the reference implementation, which saves the s x s probabilities
    like eager attention does; measured on an H200)."""
    if s.attention == "eager":
        return "eager"
    if s.attention == "flash_attention_2" or s.device == "cpu" or s.e != 4:
        return "flash"
    return "math" if d.heads > d.kv_heads else "efficient"


def _layer_saved(arch: Arch, d: Dims, s: Setup, input_grad: bool) -> _Saved:
    """Every storage one decoder layer saves for backward, by name (bytes), following the Hugging Face
    implementations op by op (measured in bench/estimate_accuracy.py):

    - norms: see `_norm`; linears: see `_linear`.
    - rotary: q*cos and rotate_half(q)*sin save only cos/sin (model-wide, counted once), since cos
      and sin need no gradient; the rotated q and k are new tensors.
    - eager attention: matmul saves the rotated q and k (k repeated to all heads when
      num_key_value_heads < num_attention_heads), softmax saves its fp32 output (B*heads*S*S*4, the
      5as/h term of Korthikanti et al.), plus a copy in the compute dtype when that is not fp32, and
      the second matmul saves that and V (repeated for GQA, else a view that keeps the whole V or
      fused-QKV projection output alive).
    - SDPA / FlashAttention-2: q, k, v (not repeated), the output and a fp32 log-sum-exp per query and
      head; o_proj reads the output itself when the query kept the projection's memory layout, else
      a contiguous copy.
    - gated MLP: the activation saves the gate output, the product saves the activation and the up
      output, down_proj (if trained) the product: 4 x intermediate per token. GELU MLP: fc1 output,
      and fc2's input (if trained).
    - dtypes follow type promotion (fp32 hidden states times bf16 projections give fp32) and, under
      autocast, every matmul/linear/SDPA input that is not in the compute dtype is saved as a cast
      copy instead.
    """
    T, c, B, S = s.tokens, s.e, s.batch, s.seq
    saved = _Saved()
    lins = {l.role: l for l in layer_linears(arch, d)}
    grad_from_attn = input_grad or bool(s.targets & {"q", "k", "v", "qkv", "o"}) or s.full

    def fed(key: str, src_e: int, numel: int) -> None:
        """A tensor saved by an op that autocast runs in the compute dtype: a cast copy if needed."""
        if s.autocast and src_e != c:
            saved.put(f"{key}_c", numel * c)
        else:
            saved.put(key, numel * src_e)

    x_e = s.r_e
    n1_e = _norm(saved, arch, d, s, "norm1", "x_in", x_e, input_grad)
    if arch.fused_qkv:
        qkv_e = _linear(saved, s, lins["qkv"], "n1", n1_e, input_grad)
        q_e = k_e = v_e = qkv_e
        v_key, v_numel = "qkv_out", T * (d.q_dim + 2 * d.kv_dim)
    else:
        q_e = _linear(saved, s, lins["q"], "n1", n1_e, input_grad)
        k_e = _linear(saved, s, lins["k"], "n1", n1_e, input_grad)
        v_e = _linear(saved, s, lins["v"], "n1", n1_e, input_grad)
        v_key, v_numel = "v_out", T * d.kv_dim
    # Rotary embeddings multiply by cos/sin in the hidden states' dtype (type promotion).
    qr_e, kr_e = max(q_e, x_e), max(k_e, x_e)

    # Which of q, k, v need a gradient: all of them, except in a LoRA model's first layer (whose
    # input comes from a frozen embedding) where only the adapted projections do.
    def needs(role: str) -> bool:
        return input_grad or s.full or role in s.targets or "qkv" in s.targets

    q_grad, k_grad, v_grad = needs("q"), needs("k"), needs("v")
    groups = max(1, d.heads // d.kv_heads)
    kernel = attention_kernel(d, s)
    if kernel in ("eager", "math"):
        # scores = q @ k^T saves each side only if the other needs a gradient; softmax saves its
        # output if the scores need one; probs @ v saves probs if v needs one and v if probs do.
        scores_grad = q_grad or k_grad
        if k_grad:
            fed("q_rot", qr_e, T * d.q_dim)
        if q_grad:
            if groups > 1:
                fed("k_rep", kr_e, T * d.q_dim)
            else:
                fed("k_rot", kr_e, T * d.kv_dim)
        if scores_grad:
            saved.put("probs32", B * d.heads * S * S * 4)
        if v_grad:
            # softmax(..., dtype=float32).to(query.dtype), then cast again by autocast if needed
            probs_e = c if s.autocast else qr_e
            saved.put("probs32" if probs_e == 4 else "probs", B * d.heads * S * S * probs_e)
        if scores_grad:
            if groups > 1:
                fed("v_rep", v_e, T * d.q_dim)
            elif arch.fused_qkv and B > 1:
                # bmm needs (B*heads, S, dim): a strided view of the fused output is copied
                fed("v_copy", v_e, T * d.kv_dim)
            elif s.autocast and v_e != c:
                saved.put("v_c", T * d.kv_dim * c)
            else:
                # a view: it keeps the whole projection output (all of QKV when fused) alive
                saved.put(v_key, v_numel * v_e)
        o_in, o_e = "attn_out", (c if s.autocast else qr_e)
    else:
        fed("q_rot", qr_e, T * d.q_dim)
        fed("k_rot", kr_e, T * d.kv_dim)
        if s.autocast and v_e != c:
            saved.put("v_c", T * d.kv_dim * c)
        else:
            saved.put(v_key, v_numel * v_e)
        o_e = c if s.autocast else qr_e
        if kernel == "efficient":
            # CUDA's memory-efficient kernel pads the log-sum-exp to 32 queries and writes its
            # output in (B, S, heads, dim) layout, which o_proj then reads without a copy.
            saved.put("lse", B * d.heads * (-(-S // 32) * 32) * 4)
            saved.put("sdpa_out", T * d.q_dim * o_e)
            o_in = "sdpa_out"
        else:
            saved.put("lse", B * d.heads * S * 4)
            saved.put("sdpa_out", T * d.q_dim * o_e)
            o_in = "sdpa_out" if arch.query_layout_bshd else "attn_out"
    o_out_e = _linear(saved, s, lins["o"], o_in, o_e, True)

    # Second norm: on the layer input (parallel residual) or on input + attention output.
    if d.parallel_residual:
        n2_e = _norm(saved, arch, d, s, "norm2", "x_in", x_e, input_grad)
        mlp_in_grad = True
    else:
        n2_e = _norm(saved, arch, d, s, "norm2", "resid1", max(x_e, o_out_e), grad_from_attn)
        mlp_in_grad = grad_from_attn
    i = d.intermediate
    if arch.gated_mlp:
        if arch.fused_gate_up:
            g_e = u_e = _linear(saved, s, lins["gate_up"], "n2", n2_e, mlp_in_grad)
            saved.put("gate_up_out", T * 2 * i * g_e)
        else:
            g_e = _linear(saved, s, lins["gate"], "n2", n2_e, mlp_in_grad)
            u_e = _linear(saved, s, lins["up"], "n2", n2_e, mlp_in_grad)
            saved.put("gate_out", T * i * g_e)
            saved.put("up_out", T * i * u_e)
        saved.put("act_out", T * i * g_e)
        _linear(saved, s, lins["down"], "prod", max(g_e, u_e), True)
    else:
        g_e = _linear(saved, s, lins["fc1"], "n2", n2_e, mlp_in_grad)
        saved.put("fc1_out", T * i * g_e)
        _linear(saved, s, lins["fc2"], "act_out", g_e, True)
    return saved


def _activations(arch: Arch, d: Dims, s: Setup) -> dict[str, Any]:
    T, e = s.tokens, s.e
    full_layer = _layer_saved(arch, d, s, input_grad=True)
    # Without checkpointing, a frozen embedding gives layer 0 an input that needs no gradient, so
    # its first norm saves nothing (LoRA); checkpointing makes the input require grad (HF's
    # enable_input_require_grads).
    first_grad = s.full or s.checkpointing
    first_layer = full_layer if first_grad else _layer_saved(arch, d, s, input_grad=False)
    per_layer = full_layer.total()
    r_e = s.r_e
    layer_input = T * d.hidden * r_e

    model = _Saved()
    # cos and sin: (1, S, rotary_dim) each in the hidden states' dtype, shared by the batch and by
    # every layer.
    model.put("rotary_cos_sin", 2 * s.seq * d.rotary_dim * r_e)
    if s.full:
        model.put("input_ids", T * 8)
    model.put("labels", T * 8)
    final_e = _norm(model, arch, d, s, "final_norm", "x_final", r_e, True)
    lm_head = Linear("lm_head", "lm_head", d.hidden, d.vocab, False)
    _linear(model, s, lm_head, "final_out", final_e, True)
    model_level = model.total()

    kept = extra_inputs = recompute = 0
    if not s.checkpointing:
        total = first_layer.total() + per_layer * (d.layers - 1) + model_level
    else:
        kept = d.layers * layer_input
        extra_inputs = T * 8  # position ids, kept by the checkpoint's closure
        if s.attention == "eager":
            extra_inputs += s.batch * s.seq * s.seq * r_e  # the 4-D causal mask, kept the same way
        recompute = full_layer.total(without={"x_in"})
        # bitsandbytes' int8 matmul keeps its input as a ctx attribute, out of reach of the
        # checkpoint's saved-tensor hooks: every layer keeps those inputs anyway.
        ctx_held = sum(v for k, v in full_layer.items.items() if k in full_layer.ctx_held and k != "x_in")
        kept += d.layers * ctx_held
        total = kept + extra_inputs + recompute + model_level
    with_scores = attention_kernel(d, s) in ("eager", "math")
    eager_scores = s.batch * d.heads * s.seq * s.seq * (4 + (e if e != 4 else 0)) if with_scores else 0
    return {
        "total": total,
        "per_layer": per_layer,
        "per_layer_items": dict(full_layer.items),
        "first_layer": first_layer.total(),
        "layer_input": layer_input,
        "attention_scores_per_layer": eager_scores,
        "model_level": model_level,
        "model_level_items": dict(model.items),
        "checkpointed_inputs": kept,
        "checkpoint_extra_inputs": extra_inputs,
        "recompute_one_layer": recompute,
    }


def activation_bytes(arch: Arch, d: Dims, s: Setup) -> dict[str, Any]:
    """Saved activations of the whole model and their pieces (see `_layer_saved`), with the totals
    with and without checkpointing side by side.

    Without checkpointing: every layer's saved tensors + the model-level ones (rotary cos/sin, the
    final norm, lm_head's input if trained, token ids and labels). With it (non-reentrant, every
    layer): each layer's input (B*S*hidden) and keyword inputs (position ids, eager's 4-D mask),
    plus one layer's saved tensors while it is recomputed in the backward pass, plus the same
    model-level tensors.
    """
    own = _activations(arch, d, s)
    other = _activations(arch, d, dataclasses.replace(s, checkpointing=not s.checkpointing))
    own["with_checkpointing"] = own["total"] if s.checkpointing else other["total"]
    own["without_checkpointing"] = other["total"] if s.checkpointing else own["total"]
    return own


# --- the breakdown --------------------------------------------------------------------------


@dataclass
class Breakdown:
    """Bytes per part of one training step on one device (see the module docstring)."""

    weights: int = 0
    adapters: int = 0
    gradients: int = 0
    optimizer: int = 0
    master_weights: int = 0
    activations: int = 0
    logits: int = 0
    runtime: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown().values())

    def breakdown(self) -> dict[str, int]:
        return {part: int(getattr(self, part)) for part in PARTS}

    def to_json(self, details: bool = False) -> dict[str, Any]:
        """`{"total_bytes": int, "breakdown": {part: int}}` (and `details` when asked)."""
        out: dict[str, Any] = {"total_bytes": self.total_bytes, "breakdown": self.breakdown()}
        if details:
            out["details"] = self.details
        return out

    def format_table(self) -> str:
        """A CLI table: part, bytes in GiB/MiB, share of the total."""
        total = self.total_bytes or 1
        lines = [f"{'part':<16}{'size':>12}{'share':>8}"]
        for part, value in self.breakdown().items():
            lines.append(f"{part:<16}{human_bytes(value):>12}{value / total:>8.1%}")
        lines.append(f"{'total':<16}{human_bytes(self.total_bytes):>12}{1:>8.0%}")
        for warning in self.details.get("warnings", []):
            lines.append(f"note: {warning}")
        return "\n".join(lines)


def human_bytes(n: int) -> str:
    """1.50 GiB, 12.0 MiB, 512 KiB, 12 B."""
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n} B"


def estimate(
    model_config: dict[str, Any] | str | Path,
    run: RunConfig,
    *,
    num_gpus: int = 1,
    zero_stage: int = 0,
    device: Literal["cuda", "cpu"] = "cpu",
    bf16_supported: bool = True,
    autocast: bool | None = None,
) -> Breakdown:
    """Estimate the memory of one training step of `run` on one device.

    model_config: config.json as a dict, a model folder (only config.json is read, nothing is
    downloaded), the file itself, or a `bundled:` path. num_gpus / zero_stage: data-parallel GPUs
    and the DeepSpeed ZeRO stage (0-3); technique.offload raises the stage to 2 or 3 and moves
    state to CPU memory. device: "cpu" resolves precision auto to fp32 and has no runtime part;
    "cuda" resolves it to bf16 (fp16 when bf16_supported is False).

    autocast (bf16/fp16 only): True is the Hugging Face Trainer's recipe, which the worker runs:
    adapters over a base loaded in bf16/fp16, full tuning over fp32 weights (4 B weights + 4 B
    gradients + 8 B Adam, no separate master copy, plus bf16 copies of the weights saved by
    autocast), k-bit bases with their other weights cast to fp32 by peft's
    prepare_model_for_kbit_training, all run under torch.autocast. False: the model is held in
    bf16/fp16 and runs as it is, full tuning keeping an fp32 master copy in the optimizer (the ZeRO
    paper's 2 + 2 + 4 + 8 bytes; what DeepSpeed does). None (default): True, except with DeepSpeed
    (zero_stage > 0 or technique.offload).
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if num_gpus < 1:
        raise ValueError("num_gpus must be at least 1")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError("zero_stage must be 0, 1, 2 or 3")
    raw = load_model_config(model_config)
    arch, d, warnings = read_dims(raw)
    deepspeed = device == "cuda" and (zero_stage > 0 or run.technique.offload != "none")
    s, more = resolve_setup(arch, d, run, device, bf16_supported, autocast, deepspeed)
    warnings += more
    t = run.technique
    counts = count_params(arch, d)

    # -- weights, by storage type
    e = s.e
    w_dtype = "fp32" if s.w_e == 4 else s.dtype
    buffers = 2 * (d.rotary_dim // 2) * 4  # rotary inv_freq and original_inv_freq, fp32
    unquantized = counts.total - counts.linear_weights
    storage: dict[str, Any] = {"fp32": 0, "bf16": 0, "fp16": 0, "int8": 0, "nf4": 0, "nf4_constants": 0, "int8_scales": 0}
    if s.quant == "nf4":
        lins = layer_linears(arch, d)
        nf4 = {"data": 0, "constants": 0}
        for lin in lins:
            one = nf4_bytes(lin.inp * lin.out, double_quant=True)
            nf4["data"] += one["data"] * d.layers
            nf4["constants"] += one["constants"] * d.layers
        storage["nf4"] = nf4["data"]
        storage["nf4_constants"] = nf4["constants"]
        storage["double_quant"] = True
        storage[w_dtype] += unquantized * s.w_e
    elif s.quant == "int8":
        storage["int8"] = counts.linear_weights
        storage["int8_scales"] = sum(l.out for l in layer_linears(arch, d)) * d.layers * 4
        storage[w_dtype] += unquantized * s.w_e
    else:
        storage[w_dtype] += counts.total * s.w_e
    storage["fp32"] += buffers
    weights = sum(v for k, v in storage.items() if isinstance(v, int) and not isinstance(v, bool))

    # -- adapters
    lins = layer_linears(arch, d)
    adapter_params = 0
    adapter_tensors = 0
    if s.adapted:
        for lin in lins:
            if lin.role in s.targets:
                adapter_params += s.rank * (lin.inp + lin.out) + (lin.out if s.method == "dora" else 0)
                adapter_tensors += 2 + (1 if s.method == "dora" else 0)
        adapter_params *= d.layers
        adapter_tensors *= d.layers
        if "lm_head" in s.targets:
            adapter_params += s.rank * (d.hidden + d.vocab) + (d.vocab if s.method == "dora" else 0)
            adapter_tensors += 2 + (1 if s.method == "dora" else 0)
    adapters = adapter_params * s.adapter_e

    # -- model states: gradients, optimizer, master weights
    if s.full:
        # Gradients take the weights' dtype; an fp32 master copy exists only when the weights
        # themselves are bf16/fp16 (without autocast).
        trained, trained_tensors, grad_e = counts.total, counts.tensors, s.w_e
        master = counts.total * 4 if s.w_e != 4 else 0
    else:
        trained, trained_tensors, grad_e = adapter_params, adapter_tensors, s.adapter_e
        master = 0
    gradients = trained * grad_e
    if t.optimizer == "adamw":
        optimizer = trained * 8 + trained_tensors * 4
        opt_detail = {"kind": "adamw", "bytes_per_param": 8, "step_tensors": trained_tensors * 4}
    else:
        sizes = _trained_tensor_sizes(arch, d, s, counts)
        small = sum(n for n in sizes if n < ADAM8_MIN_SIZE)
        big = sum(n for n in sizes if n >= ADAM8_MIN_SIZE)
        blocks = sum(math.ceil(n / ADAM8_BLOCK) for n in sizes if n >= ADAM8_MIN_SIZE)
        optimizer = big * 2 + blocks * 2 * 4 + small * 8 + 2 * 256 * 4
        opt_detail = {
            "kind": t.optimizer,
            "bytes_per_param": 2,
            "block_constants": blocks * 2 * 4,
            "fp32_small_tensors": small * 8,
            "paged": t.optimizer == "paged_adamw_8bit",
        }

    # -- activations and logits
    act = activation_bytes(arch, d, s)
    activations = act["total"]
    tv = s.tokens * d.vocab
    logit_e = e if s.autocast else s.w_e
    logits_fwd = tv * (logit_e + 4 + (4 if logit_e != 4 else 0))
    logits_bwd = tv * (4 + 4 + 4)
    logits = max(logits_fwd, logits_bwd)
    if t.liger_kernel:
        # Liger's fused linear cross-entropy never materialises the logits: it walks the tokens in
        # chunks and keeps one chunk's fp32 logits and their gradient (Liger's chunk is about
        # vocab/hidden rows, at least 1). Not measured here (it needs CUDA); derived from the kernel.
        chunk = max(1, min(s.tokens, -(-d.vocab // d.hidden)))
        logits_fwd = logits_bwd = logits = chunk * d.vocab * (4 + 4)

    # -- distribution: ZeRO stages, DDP buckets, offload
    dist: dict[str, Any] = {"num_gpus": num_gpus, "zero_stage": zero_stage, "offload": t.offload}
    offloaded = 0
    if device == "cuda":
        stage = zero_stage
        if t.offload == "zero2_optimizer":
            stage = max(stage, 2)
        elif t.offload == "zero3_optimizer_params":
            stage = 3
        dist["effective_stage"] = stage
        n = num_gpus
        if stage == 0 and n > 1:
            dist["ddp_bucket_bytes"] = gradients  # DDP's flat buckets hold a second copy of the gradients
            gradients *= 2
        if stage >= 1:
            optimizer = math.ceil(optimizer / n)
            master = math.ceil(master / n)
        if stage >= 2:
            gradients = math.ceil(gradients / n)
        if stage >= 3:
            per_layer_weights = (weights - buffers) // max(1, d.layers)
            gathered = 2 * per_layer_weights  # the layer being computed and the prefetched one
            dist["zero3_gathered_bytes"] = gathered
            if t.offload == "zero3_optimizer_params":
                offloaded += weights + adapters
                weights = gathered
            else:
                weights = math.ceil(weights / n) + gathered
            adapters = math.ceil(adapters / n)
        if t.offload != "none":
            offloaded += optimizer + master
            optimizer = 0
            master = 0
        dist["cpu_offloaded_bytes"] = offloaded
    elif num_gpus > 1 or zero_stage or t.offload != "none":
        warnings.append("num_gpus, zero_stage and offload apply to CUDA only; ignored for device cpu")

    # -- runtime: fixed costs plus the larger of the transients of the two phases of a step
    runtime_detail = {
        "cuda_context": 0,
        "cublas_workspace": 0,
        "allocator_slack": 0,
        "dequant_buffer": 0,
        "dora_weight_norm": 0,
        "optimizer_step_buffer": 0,
    }
    if device == "cuda":
        runtime_detail["cuda_context"] = CUDA_CONTEXT_BYTES
        runtime_detail["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
        runtime_detail["allocator_slack"] = int(ALLOCATOR_SLACK * (activations + logits + gradients))
        if s.quant:
            runtime_detail["dequant_buffer"] = counts.largest_linear * e
        if s.method == "dora":
            runtime_detail["dora_weight_norm"] = dora_transient(arch, d, s)
        if t.optimizer == "adamw" and dist.get("effective_stage", 0) == 0:
            # torch's foreach AdamW (the CUDA default) builds sqrt(v) for all parameters at once;
            # DeepSpeed's fused Adam (ZeRO stages, offload) does not.
            runtime_detail["optimizer_step_buffer"] = trained * 4
    fixed = runtime_detail["cuda_context"] + runtime_detail["cublas_workspace"] + runtime_detail["allocator_slack"]
    fwd_bwd_transient = runtime_detail["dequant_buffer"] + runtime_detail["dora_weight_norm"]
    step_transient = runtime_detail["optimizer_step_buffer"]
    runtime = fixed + max(fwd_bwd_transient, step_transient)

    # A tighter peak than the sum: a steady-state step holds the static states throughout; at the
    # start of the backward pass all activations plus the loss buffers (or, once lm_head's backward
    # runs in full tuning, the logits' gradient and lm_head's weight gradient); at the optimizer step
    # the gradients plus the optimizer's temporary. Gradients survive between micro-batches when
    # accumulating. (Checked against torch.cuda.max_memory_allocated on an H200: within 8%.)
    static = weights + adapters + optimizer + master
    lm_head_grad = d.vocab * d.hidden * grad_e if s.full else 0
    accumulated = gradients if run.train.gradient_accumulation_steps > 1 else 0
    phases = {
        "backward_start": static + activations + max(logits, tv * 4 + lm_head_grad) + accumulated + fwd_bwd_transient,
        "optimizer_step": static + gradients + step_transient,
    }
    phases["peak"] = max(phases.values()) + fixed

    details: dict[str, Any] = {
        "model": {
            "model_type": d.model_type,
            "family": arch.family,
            "parameters": counts.total,
            "linear_parameters": counts.linear_weights,
            "embedding_parameters": counts.embedding + counts.lm_head,
            "tied_embeddings": d.tied,
            "layers": d.layers,
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "heads": d.heads,
            "kv_heads": d.kv_heads,
            "head_dim": d.head_dim,
            "vocab_size": d.vocab,
        },
        "setup": {
            "method": s.method,
            "precision": s.dtype,
            "attention": s.attention,
            "attention_kernel": attention_kernel(d, s),
            "autocast": s.autocast,
            "weights_dtype": w_dtype,
            "gradient_checkpointing": s.checkpointing,
            "micro_batch_size": s.batch,
            "seq_len": s.seq,
            "device": device,
            "lora_targets": sorted(s.targets),
        },
        "weights": storage,
        "trainable_parameters": trained,
        "adapter_parameters": adapter_params,
        "optimizer": opt_detail,
        "activations": act,
        "logits": {"forward": logits_fwd, "backward": logits_bwd, "elements": tv},
        "distributed": dist,
        "runtime": runtime_detail,
        "peak_phases": phases,
        "warnings": warnings,
    }
    return Breakdown(
        weights=weights,
        adapters=adapters,
        gradients=gradients,
        optimizer=optimizer,
        master_weights=master,
        activations=activations,
        logits=logits,
        runtime=runtime,
        details=details,
    )


def dora_transient(arch: Arch, d: Dims, s: Setup) -> int:
    """PEFT's DoRA recomputes the weight norm ||W + s*B@A|| in every forward pass (and in the
    recompute with checkpointing): B@A is built by pushing an identity (in x in, adapter dtype)
    through the adapter, and W + s*B@A is materialized (out x in): a transient of about
    in^2*4 + out*in*(4 + 2e) bytes for the largest adapted linear."""
    worst = 0
    for lin in layer_linears(arch, d):
        if lin.role in s.targets:
            ae, e = s.adapter_e, s.e
            size = lin.inp * lin.inp * ae + lin.out * lin.inp * (ae + (e if e != ae else 0) + 2 * e)
            worst = max(worst, size)
    return worst


def _trained_tensor_sizes(arch: Arch, d: Dims, s: Setup, counts: ParamCounts) -> list[int]:
    """Element counts of every trained tensor (for 8-bit Adam's small-tensor rule)."""
    sizes: list[int] = []
    lins = layer_linears(arch, d)
    if s.full:
        for lin in lins:
            sizes.append(lin.inp * lin.out)
            if lin.bias:
                sizes.append(lin.out)
        sizes = sizes * d.layers
        per_norm = [d.hidden] * (2 if arch.norm == "layer" else 1)
        sizes += per_norm * (2 * d.layers + 1)
        sizes.append(counts.embedding)
        if counts.lm_head:
            sizes.append(counts.lm_head)
        return sizes
    for lin in lins:
        if lin.role in s.targets:
            sizes += [s.rank * lin.inp, s.rank * lin.out] + ([lin.out] if s.method == "dora" else [])
    sizes = sizes * d.layers
    if "lm_head" in s.targets:
        sizes += [s.rank * d.hidden, s.rank * d.vocab] + ([d.vocab] if s.method == "dora" else [])
    return sizes
