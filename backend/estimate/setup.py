"""The run's choices (RunConfig) resolved for one device into a Setup."""

from __future__ import annotations

from dataclasses import dataclass

from backend.config import RunConfig
from backend.estimate.architectures import Arch, Dims, layer_linears


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
