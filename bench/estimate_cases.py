"""The configurations bench/estimate_accuracy.py measures: tiny random-weight models of every family
(the Llama, GPT-NeoX, Qwen2 and Phi-3 below, the others from tests/families.py) and the runs on them.

Torch-free; bench/estimate_measure.py builds and measures them, bench/estimate_accuracy.py compares.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backend.core.config.run_config import RunConfig  # noqa: E402
from tests.families import FAMILIES as TINY_FAMILIES  # noqa: E402

TINY_DIR = ROOT / "resources" / "tiny"

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
"""A small Llama with grouped-query attention (4 query heads, 2 key/value heads) and a gated MLP."""

TINY_NEOX = {
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
    "hidden_act": "gelu",
}
"""A small GPT-NeoX (Pythia-style): fused QKV with bias, LayerNorm, parallel residual, GELU MLP."""

TINY_QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}
"""A small Qwen2: biased q/k/v, no grouping (kv heads = heads), tied embeddings."""

TINY_PHI3 = {
    "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "original_max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "pad_token_id": 0,
}
"""A small Phi-3: fused qkv_proj and gate_up_proj."""

TINY_QWEN3_5 = {
    "model_type": "qwen3_5_text",
    "architectures": ["Qwen3_5ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "pad_token_id": 0,
}
"""A small Qwen3.5 text decoder: two Gated DeltaNet layers (the chunked rule's PyTorch fallback on the
CPU) and two gated attention layers."""

ARCH_CONFIGS = {
    "gpt_neox": TINY_NEOX,
    "gpt_neox_seq": {**TINY_NEOX, "use_parallel_residual": False},
    "qwen2": TINY_QWEN2,
    "phi3": TINY_PHI3,
    "mistral_window": {**TINY_FAMILIES["mistral"], "sliding_window": 64},
    "phi3_window": {**TINY_PHI3, "sliding_window": 100},
    "phi3_dropout": {**TINY_PHI3, "resid_pdrop": 0.1, "embd_pdrop": 0.1},
    "qwen3_5_text": TINY_QWEN3_5,
}
"""The bench's own configs; the _window ones put every layer in a sliding window the rows reach
(Mistral v0.1's 4096, Phi-3-mini's 2047 at real size), which gives SDPA a 4-D mask."""


def llama_config_dict() -> dict[str, Any]:
    """The bundled tiny model's config.json when the folder exists, else TINY_LLAMA."""
    path = TINY_DIR / "config.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return dict(TINY_LLAMA)


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration of the matrix."""

    arch: str
    """"llama" (the bundled tiny model), a key of ARCH_CONFIGS or of tests/families.py's FAMILIES."""
    method: str  # "lora", "dora" or "full"
    checkpointing: bool
    attention: str  # "eager" or "sdpa"
    seq_len: int
    batch: int
    lora_rank: int = 8
    lora_targets: str = "all-linear"
    precision: str = "fp32"  # what the CPU runs: "auto" resolves to fp32 there
    lora_dropout: float = 0.0
    autocast: bool = False
    """Run as the Trainer does with bf16/fp16 on: the forward under torch.autocast, the base loaded
    in the compute dtype for adapters and in fp32 for full tuning. Off: the model is held in the
    compute dtype and runs without autocast."""
    answer: int = 0
    """0: every token is a target (raw text). N: only each row's last N tokens are, and the step
    runs as the worker's does, logits at the loss positions only; predicted with target_tokens=N."""

    @property
    def name(self) -> str:
        gc = "+gc" if self.checkpointing else ""
        tgt = "" if self.lora_targets == "all-linear" or self.method == "full" else f"[{self.lora_targets}]"
        tgt += f"(r{self.lora_rank}" + (f",p{self.lora_dropout})" if self.lora_dropout else ")") if self.method != "full" else ""
        amp = "+amp" if self.autocast else ""
        answer = f"/answer{self.answer}" if self.answer else ""
        return (f"{self.arch}/{self.method}{tgt}{gc}/{self.attention}/s{self.seq_len}xb{self.batch}/{self.precision}"
                f"{amp}{answer}")

    def model_config(self) -> dict[str, Any]:
        if self.arch == "llama":
            return llama_config_dict()
        return dict(ARCH_CONFIGS.get(self.arch) or TINY_FAMILIES[self.arch])

    @property
    def family(self) -> str:
        """The family measured (the config's model_type)."""
        return str(self.model_config()["model_type"])

    def run_config(self) -> RunConfig:
        return RunConfig.from_dict(
            {
                "technique": {
                    "method": self.method,
                    "lora_rank": self.lora_rank,
                    "lora_alpha": 2.0 * self.lora_rank,
                    "lora_targets": self.lora_targets,
                    "lora_dropout": self.lora_dropout,
                    "gradient_checkpointing": self.checkpointing,
                    "attention": self.attention,
                    "precision": self.precision,
                    "packing": False,  # the matrix measures padded micro-batches of seq_len rows
                },
                "train": {"micro_batch_size": self.batch, "seq_len": self.seq_len},
            }
        )


MATRIX: list[Case] = [
    # Llama: LoRA / full, checkpointing on and off, eager and SDPA, two lengths, two batch sizes.
    Case("llama", "lora", False, "eager", 128, 1),
    Case("llama", "lora", False, "sdpa", 256, 2),
    Case("llama", "lora", True, "eager", 256, 2),
    Case("llama", "lora", True, "sdpa", 128, 1),
    Case("llama", "full", False, "eager", 256, 2),
    Case("llama", "full", False, "sdpa", 128, 1),
    Case("llama", "full", True, "eager", 128, 1),
    Case("llama", "full", True, "sdpa", 256, 2),
    Case("llama", "dora", False, "sdpa", 128, 2),
    Case("llama", "lora", False, "eager", 128, 2, lora_rank=16, lora_targets="q_proj,v_proj"),
    # GPT-NeoX: the other architecture family.
    Case("gpt_neox", "lora", False, "eager", 256, 1),
    Case("gpt_neox", "lora", True, "sdpa", 128, 2),
    Case("gpt_neox", "full", False, "sdpa", 256, 2),
    Case("gpt_neox", "full", True, "eager", 128, 1),
    Case("gpt_neox", "lora", False, "sdpa", 128, 2, precision="bf16"),
    Case("llama", "lora", False, "sdpa", 128, 2, precision="bf16"),
    # Edge cases: bf16 eager (the softmax copy), DoRA in bf16, LoRA dropout, sequential residual,
    # no grouped-query attention with tied embeddings, fused qkv / gate_up projections.
    Case("llama", "lora", False, "eager", 256, 1, precision="bf16"),
    Case("gpt_neox", "dora", True, "eager", 128, 1, precision="bf16"),
    Case("llama", "lora", False, "sdpa", 128, 1, lora_dropout=0.1),
    # Instruction data: logits only at the answers' positions (backend/training/shortcuts/loss_positions.py).
    Case("llama", "lora", False, "sdpa", 256, 2, answer=40),
    Case("qwen2", "lora", True, "eager", 128, 2, answer=100),
    Case("gpt_neox_seq", "lora", False, "eager", 128, 2),
    Case("qwen2", "full", False, "eager", 256, 1),
    Case("qwen2", "lora", True, "sdpa", 128, 2, lora_targets="q_proj,k_proj,v_proj,o_proj"),
    Case("phi3", "lora", False, "sdpa", 256, 1),
    Case("phi3", "full", False, "eager", 128, 2),
    # Quantized bases through bitsandbytes (which runs on the CPU too).
    Case("llama", "qlora", False, "sdpa", 128, 2, precision="bf16"),
    Case("llama", "lora8", True, "eager", 128, 1, precision="bf16"),
    Case("llama", "lora8", False, "sdpa", 128, 2, precision="bf16"),
    Case("gpt_neox", "qlora", True, "sdpa", 256, 1, precision="bf16"),
    # The Trainer's recipe with bf16 on (what the worker runs): forward under torch.autocast;
    # full tuning over fp32 weights; k-bit bases through prepare_model_for_kbit_training.
    Case("llama", "lora", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "lora", True, "eager", 128, 1, precision="bf16", autocast=True, lora_dropout=0.1),
    Case("llama", "full", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "full", True, "eager", 256, 1, precision="bf16", autocast=True),
    Case("gpt_neox", "lora", False, "eager", 128, 2, precision="bf16", autocast=True),
    Case("gpt_neox", "full", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "dora", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "qlora", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "qlora", True, "eager", 128, 1, precision="bf16", autocast=True),
    Case("gpt_neox", "qlora", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "lora8", False, "sdpa", 128, 1, precision="bf16", autocast=True),
]
"""The first forty-one configurations (Llama, GPT-NeoX, Qwen2, Phi-3)."""

EXPERTS_TOO = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _family(arch: str, *specs: tuple) -> list[Case]:
    """Cases of one family: (method, checkpointing, attention, seq_len, batch, precision, autocast)."""
    return [Case(arch, m, gc, attn, seq, b, precision=p, autocast=amp) for m, gc, attn, seq, b, p, amp in specs]


FAMILY_MATRIX: list[Case] = [
    *_family("mistral",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", True, "eager", 128, 1, "fp32", False),
             ("qlora", False, "sdpa", 128, 2, "bf16", True), ("lora", True, "sdpa", 128, 1, "bf16", True)),
    *_family("mistral_window",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", True, "sdpa", 128, 1, "fp32", False),
             ("lora", False, "sdpa", 128, 1, "bf16", True)),
    *_family("phi3_window", ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", True, "sdpa", 128, 1, "bf16", True)),
    *_family("phi3_dropout", ("lora", False, "sdpa", 128, 2, "fp32", False)),
    *_family("qwen3",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "eager", 128, 1, "fp32", False),
             ("full", True, "sdpa", 256, 2, "fp32", False), ("lora", False, "sdpa", 128, 2, "bf16", True),
             ("dora", False, "sdpa", 128, 1, "fp32", False), ("qlora", False, "sdpa", 128, 2, "bf16", True),
             ("lora8", True, "sdpa", 128, 1, "bf16", True), ("full", False, "sdpa", 128, 2, "bf16", True)),
    *_family("gemma2",
             ("lora", False, "eager", 128, 2, "fp32", False), ("full", False, "eager", 128, 1, "fp32", False),
             ("full", True, "eager", 128, 2, "fp32", False), ("lora", False, "eager", 128, 2, "bf16", True),
             ("qlora", False, "eager", 128, 1, "bf16", True), ("dora", False, "eager", 128, 1, "fp32", False),
             ("lora", True, "eager", 128, 1, "bf16", True), ("full", False, "eager", 128, 1, "bf16", True),
             ("lora8", False, "eager", 128, 1, "bf16", True)),
    *_family("gemma3_text",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "sdpa", 128, 1, "fp32", False),
             ("full", True, "eager", 128, 2, "fp32", False), ("lora", False, "sdpa", 128, 2, "bf16", True),
             ("qlora", False, "sdpa", 128, 1, "bf16", True), ("lora8", False, "sdpa", 128, 1, "bf16", True),
             ("full", True, "sdpa", 128, 1, "fp32", False), ("lora", False, "eager", 128, 1, "fp32", False),
             ("full", False, "sdpa", 128, 2, "bf16", True), ("dora", True, "sdpa", 128, 1, "fp32", False)),
    *_family("phi3",
             ("lora", False, "sdpa", 128, 2, "bf16", True), ("qlora", False, "sdpa", 128, 1, "bf16", True),
             ("full", True, "sdpa", 128, 2, "fp32", False), ("lora8", False, "eager", 128, 1, "bf16", True),
             ("dora", False, "sdpa", 128, 1, "fp32", False)),
    *_family("gpt2",
             ("lora", False, "eager", 128, 1, "fp32", False), ("lora", False, "sdpa", 128, 2, "fp32", False),
             ("full", False, "eager", 128, 2, "fp32", False), ("full", True, "sdpa", 128, 1, "fp32", False),
             ("lora", False, "sdpa", 128, 2, "bf16", True), ("qlora", False, "eager", 128, 1, "bf16", True),
             ("dora", False, "sdpa", 128, 1, "fp32", False), ("lora8", False, "sdpa", 128, 1, "bf16", True),
             ("full", False, "eager", 128, 1, "bf16", True), ("lora", True, "eager", 128, 2, "fp32", False)),
    *_family("qwen2_moe",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "sdpa", 128, 1, "fp32", False),
             ("full", True, "eager", 128, 1, "fp32", False), ("lora", False, "sdpa", 128, 2, "bf16", True),
             ("qlora", False, "sdpa", 128, 1, "bf16", True), ("lora", True, "sdpa", 128, 2, "fp32", False),
             ("dora", False, "sdpa", 128, 1, "fp32", False), ("lora8", False, "sdpa", 128, 1, "bf16", True)),
    *_family("qwen3_moe",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "sdpa", 128, 1, "fp32", False),
             ("lora", True, "sdpa", 128, 1, "fp32", False), ("lora", False, "sdpa", 128, 2, "bf16", True),
             ("qlora", False, "sdpa", 128, 1, "bf16", True), ("full", True, "eager", 128, 1, "fp32", False),
             ("lora8", False, "sdpa", 128, 1, "bf16", True), ("full", False, "sdpa", 128, 1, "bf16", True)),
    *_family("mixtral",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "sdpa", 128, 1, "fp32", False),
             ("lora", True, "sdpa", 128, 1, "bf16", True), ("qlora", False, "sdpa", 128, 1, "bf16", True),
             ("lora8", False, "eager", 128, 1, "bf16", True), ("full", True, "sdpa", 128, 2, "fp32", False)),
    *_family("qwen3_5_text",
             ("lora", False, "sdpa", 128, 2, "fp32", False), ("full", False, "sdpa", 100, 1, "fp32", False),
             ("lora", True, "sdpa", 200, 1, "fp32", False), ("full", True, "eager", 128, 1, "fp32", False)),
    # LoRA on the fused experts, when lora_targets names them (all-linear leaves them out):
    Case("qwen3_moe", "lora", False, "sdpa", 128, 2, lora_targets=EXPERTS_TOO),
    Case("qwen3_moe", "lora", True, "sdpa", 128, 1, precision="bf16", autocast=True, lora_targets=EXPERTS_TOO),
    Case("mixtral", "lora", False, "sdpa", 128, 2, lora_targets="q_proj,k_proj,v_proj,o_proj,w1,w2,w3"),
]
"""Every other family, each over the methods that apply (peft refuses DoRA on the fused experts of
qwen3_moe and mixtral), checkpointing on and off, eager and SDPA (Gemma 2: eager only, it refuses
SDPA), fp32 and bf16 under the Trainer's autocast."""

MATRIX += FAMILY_MATRIX

QUICK = [MATRIX[0], MATRIX[7], MATRIX[12], next(case for case in MATRIX if case.answer)]
"""Four configurations for --quick: LoRA eager, full+checkpointing SDPA, NeoX full, and LoRA on
instruction data (logits at the answers only)."""

CI_SLICE = QUICK + [
    Case("gemma2", "full", True, "eager", 128, 1),
    Case("gemma3_text", "lora", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("gpt2", "lora", False, "sdpa", 128, 2),
    Case("qwen3_moe", "lora", False, "sdpa", 128, 2, lora_targets=EXPERTS_TOO),
    Case("qwen2_moe", "qlora", False, "sdpa", 128, 1, precision="bf16", autocast=True),
]
"""What the test suite checks: the quick four plus one configuration each of Gemma 2 (soft-capping,
checkpointed), Gemma 3 (q/k norms, a sliding-window mask, autocast), GPT-2 (dropout everywhere),
Qwen3-MoE (LoRA on the fused experts, named in lora_targets) and Qwen2-MoE (QLoRA with a shared expert)."""
