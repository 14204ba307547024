"""The run's choices (RunConfig) resolved for one device into a Setup."""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.config.run_config import RunConfig
from backend.estimate.architectures import Arch, Dims, all_linears


@dataclass(frozen=True)
class Setup:
    """The run's choices, resolved for one device."""

    method: str
    compute_bytes: int
    """Compute dtype bytes (weights and activations)."""
    dtype: str
    adapter_bytes: int
    full: bool
    quant: str | None  # "nf4" | "int8" | None
    rank: int
    dropout: bool
    targets: frozenset[str]
    """Roles (q, k, v, qkv, o, gate, up, gate_up, down, fc1, fc2, shared_*, lm_head; router,
    experts_gate_up, experts_down for peft's parameter targets) that get adapters."""
    attention: str  # eager | sdpa | flash_attention_2
    checkpointing: bool
    batch: int
    seq: int
    device: str
    autocast: bool = False
    """The forward pass runs under torch.autocast (what the Trainer does with bf16/fp16 on)."""
    weight_bytes: int = 0
    """Bytes per element of the unquantized weights as loaded (fp32 for full tuning under autocast
    and for the non-quantized parts of a k-bit model prepared by peft, else the compute dtype)."""
    residual_bytes: int = 0
    """Bytes per element of the hidden states between layers (the embedding's dtype)."""
    packing: bool = False
    """Rows are packed examples (restarting position ids), which gives windowed models a mask."""
    example_len: int = 0
    """With packing, the length of one example when attention runs per example (FlashAttention-2's
    varlen path, the worker's sdpa_packed): its s x s terms are per example, not per packed row; 0
    when attention sees the whole row (eager's block-diagonal mask) or nothing is packed."""

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def attn_rows(self) -> tuple[int, int]:
        """(sequences, length) that attention's s x s terms span: the examples of a packed row when
        attention is cut per example, else the rows themselves."""
        if self.example_len:
            return self.tokens // self.example_len, self.example_len
        return self.batch, self.seq

    @property
    def adapted(self) -> bool:
        return self.method in ("lora", "dora", "qlora", "lora8")


_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
EXPERT_ROLES = frozenset({"router", "experts_gate_up", "experts_down"})


def lora_roles(arch: Arch, dims: Dims, lora_targets: str) -> tuple[set[str], list[str]]:
    """The roles `technique.lora_targets` adapts, as the worker asks peft 0.21, and warnings. For
    mixtral and qwen3_moe peft maps the experts' and router's v4 module names onto target_parameters
    of the fused experts (gate and up together: naming one alone is refused); the worker's all-linear
    there is the attention only (backend/training/model/moe.py peft_targets)."""
    names: dict[str, set[str]] = {}
    for lin, _ in all_linears(arch, dims):
        names.setdefault(lin.name, set()).add(lin.role)
    experts = arch.lora_expert_params and dims.moe_layers > 0
    if lora_targets.strip() == "all-linear":
        return {role for group in names.values() for role in group}, []
    roles: set[str] = set()
    warnings: list[str] = []
    asked = {item.strip().rsplit(".", 1)[-1] for item in lora_targets.split(",") if item.strip()}
    for item in sorted(asked):
        hit = False
        if item in names:
            roles |= names[item]
            hit = True
        if experts:
            for role, aliases in arch.expert_names.items():
                if item in aliases:
                    hit = True
                    if all(a in asked for a in aliases):
                        roles.add(role)
                    else:
                        warnings.append(f"technique.lora_targets: {item} is fused with {', '.join(aliases)} in "
                                        f"{dims.model_type}'s experts; peft refuses one without the other")
        if item == "lm_head":
            roles.add("lm_head")
            hit = True
        if not hit:
            warnings.append(f"technique.lora_targets: {item!r} is not a linear of {dims.model_type}; ignored")
    return roles, warnings


def resolve_setup(
    arch: Arch, dims: Dims, run: RunConfig, device: str, bf16_supported: bool, autocast: bool | None = None, deepspeed: bool = False
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
    if attention == "sdpa" and not arch.sdpa:
        warnings.append(f"{dims.model_type}: transformers refuses SDPA for it (no soft-capping there); estimated as eager")
        attention = "eager"
    targets, more = lora_roles(arch, dims, t.lora_targets)
    warnings += more
    if t.method != "full" and targets & EXPERT_ROLES:
        if t.method == "dora":
            warnings.append(f"{dims.model_type}: peft 0.21 refuses DoRA on the fused experts (ParamWrapper); "
                            "target the attention projections only")
        elif t.lora_dropout > 0:
            warnings.append(f"{dims.model_type}: peft 0.21 refuses lora_dropout > 0 on the fused experts (ParamWrapper)")
    quant = {"qlora": "nf4", "lora8": "int8"}.get(t.method)
    compute_bytes = _DTYPE_BYTES[dtype]
    if autocast is None:
        # The Trainer's recipe (what backend/jobs/finetune.py runs): bf16/fp16 through autocast,
        # unless DeepSpeed holds the model in that dtype itself.
        autocast = not deepspeed
    autocast = autocast and compute_bytes != 4
    if autocast and (t.method == "full" or quant):
        # full: fp32 weights, autocast computes in bf16/fp16 (no separate master copy);
        # k-bit: peft's prepare_model_for_kbit_training casts the unquantized weights to fp32.
        weight_bytes = residual_bytes = 4
    else:
        weight_bytes = residual_bytes = compute_bytes
    setup = Setup(
        method=t.method,
        compute_bytes=compute_bytes,
        dtype=dtype,
        adapter_bytes=4,
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
        weight_bytes=weight_bytes,
        residual_bytes=residual_bytes,
        packing=t.packing,
        example_len=run.train.seq_len if per_example_attention(arch, dims, run, attention) else 0,
    )
    return setup, warnings


def per_example_attention(arch: Arch, dims: Dims, run: RunConfig, attention: str) -> bool:
    """Whether a packed row's attention runs per example, as the worker decides it: FlashAttention-2
    reads the varlen boundaries; SDPA does through the sdpa_packed shortcut where that applies
    (backend/core/registries/shortcuts.py: shortcuts auto, no torch.compile, no sliding window, a family
    its tests prove). Eager attention gets a block-diagonal mask over the whole row."""
    from backend.core.registries.shortcuts import ALL

    t = run.technique
    if not t.packing or t.objective != "sft":
        return False
    if attention == "flash_attention_2":
        return True
    return (attention == "sdpa" and arch.sdpa and t.shortcuts == "auto" and not t.torch_compile
            and not dims.sliding_window and dims.model_type in ALL and arch.family != "gemma2")
