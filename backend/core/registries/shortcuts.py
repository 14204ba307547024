"""The speed shortcuts of a training step: where each one is proven and when it applies.

A shortcut computes what the plain transformers + peft step computes, with less work. Each entry
names the families where a test proved it exact (loss and gradients within 1e-5 of the plain
model: tests/backend/test_shortcut_exactness.py; bf16_base is the one inexact shortcut, held to its
own tolerance) and the conditions where it applies. A model of another family, or
`technique.shortcuts: off`, trains the plain way. The job asks `choose()` once, before loading; the
plan line names what runs and why the rest does not.

Only shortcuts that pay on a model of realistic width are here, each measured alone
(docs/benchmarks.md, "shortcuts at hidden >= 1024"), and rank-first LoRA is limited to the widths
where it paid. Dropout draws differ between a shortcut and the plain path where it cuts the rows a dropout sees (the same distribution, other
random numbers), so exactness is tested with dropout off.

Torch-free at every depth: the estimate (studio process) asks the same questions. Installing is
backend/training/shortcuts/installer.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Protocol


class ModelFacts(Protocol):
    """What the conditions read of a model (backend.training.model.model_facts.ModelFacts has it, and the
    estimate's facts too): declared here so the registry stays below training."""

    known: bool
    model_type: str
    supports_sdpa: bool
    sliding_window: bool
    hidden_size: int

    @property
    def name(self) -> str: ...


log = logging.getLogger(__name__)

DISABLE_ENV = "FINETUNE_STUDIO_SHORTCUTS_DISABLE"
"""Comma-separated shortcut names to leave out (the benchmark's per-shortcut switch; not a user setting)."""

PACKED_IMAGE_FAMILIES = frozenset({"qwen2_5_vl", "qwen3_vl"})
"""Vision families whose packed image rows tests/backend/test_vision_packing.py proves exact: flat patch lists
with a grid per image, and 3-D position ids that the text layers read per example."""

IMAGE_PACKING_REFUSED: dict[str, str] = {
    "gemma3": "Gemma 3's image tokens attend to each other both ways (token_type_ids), a mask not proven on "
              "packed rows",
    "gemma4": "Gemma 4's image tokens attend to each other both ways, a mask not proven on packed rows",
    "qwen3_5": "Qwen3.5's linear-attention layers take the rows' bounds as cu_seq_lens, which would reach its "
               "vision tower too; not proven",
    "idefics3": "SmolVLM / Idefics3 batches its image tiles per row (pixel_attention_mask), not as one list a "
                "packed row can hold",
    "smolvlm": "SmolVLM / Idefics3 batches its image tiles per row (pixel_attention_mask), not as one list a "
               "packed row can hold",
    "llava": "LLaVA-1.5's packed rows are not proven yet (its image features are per image, so it could be)",
    "llava_next": "LLaVA-NeXT batches its anyres patches per row (image_sizes), not as one list a packed row can "
                  "hold",
    "mllama": "Llama 3.2 Vision's images reach the text through cross-attention with a per-row mask "
              "(cross_attention_mask)",
}
"""Why each other proven vision family trains its image rows padded with packing on (the plan line says it)."""

DENSE = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt_neox"})
MOE = frozenset({"qwen2_moe", "qwen3_moe", "mixtral"})
ALL = DENSE | MOE | {"gpt2"}

# Rank-first LoRA products help where MKL's sgemm is slow for outputs only `rank` wide; on wider
# models the base products dominate and the custom autograd function costs more than it saves
# (docs/benchmarks.md, "shortcuts at hidden >= 1024"). Hidden sizes above this run peft's own forward.
RANK_FIRST_MAX_HIDDEN = 1024

LOSS_CHUNK_ELEMENTS = 2**24
"""chunked_loss's logit elements per chunk (64 MiB in fp32): 128 rows at a 128k vocabulary, 512 at 32k."""


def loss_chunk_rows(vocab: int, elements: int | None = None) -> int:
    """Rows per chunk of the chunked loss for a vocabulary: at least one."""
    return max(1, (LOSS_CHUNK_ELEMENTS if elements is None else elements) // max(1, vocab))


@dataclass(frozen=True)
class Situation:
    """Everything a shortcut's conditions read: the plan's choices and the model's facts."""

    device: str
    precision: str
    method: str
    attention: str  # the plan's attention (sdpa, eager, flash_attention_2, or "" for transformers' default)
    packing: bool
    torch_compile: bool
    liger_kernel: bool
    strategy: str
    world_size: int
    cpu_threads: int  # train.cpu_threads; 0: measured
    threads: int  # torch's thread count when planning
    bf16_base: bool  # cpu_features.bf16_base: LoRA, precision auto, on a CPU that multiplies bf16 natively
    facts: ModelFacts
    native_bf16: bool = False
    aux_loss: bool = False  # a MoE router's load-balancing loss is part of the training loss
    checkpointing: bool = False  # technique.gradient_checkpointing
    activation_offload: bool = False  # technique.activation_offload: asked for where memory is short
    image_rows: bool = False  # the run trains through the vision door (backend/training/vision): image rows


@dataclass(frozen=True)
class Shortcut:
    name: str
    what: str
    families: frozenset[str]
    devices: frozenset[str]
    condition: Callable[[Situation, tuple[str, ...]], str | None]  # None: applies; else why not
    exact: bool = True
    tolerance: str = "loss and gradients within 1e-5 of the plain model"
    rows: frozenset[str] = frozenset({"text"})
    """The rows it acts on: "text" (the text door's), "image" (the vision door's); a run meets only its own."""


def _loss_positions(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.liger_kernel:
        return "Liger's fused cross-entropy already skips the logits"
    if s.torch_compile:
        return "under torch.compile a per-batch count of positions would recompile"
    return None


def _last_layer_rows(s: Situation, applied: tuple[str, ...]) -> str | None:
    if "loss_positions" not in applied:
        return "needs loss_positions"
    if s.strategy not in ("single", "ddp"):
        return f"{s.strategy} wraps the layers"
    if s.aux_loss:
        return "the router's aux loss reads every row of the last layer"
    return None


def _chunked_loss(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.liger_kernel:
        return "Liger's fused cross-entropy already skips the logits"
    if s.torch_compile:
        return "under torch.compile its loop over chunks would break the graph"
    if s.strategy not in ("single", "ddp"):
        return f"{s.strategy} shards lm_head"
    return None


def _activation_offload(s: Situation, applied: tuple[str, ...]) -> str | None:
    # Asked for, not decided here: whether it is what lets a row fit rests on an estimate that is not
    # exact near the card's size, and where memory is not short it only adds copies.
    if not s.activation_offload:
        return "technique.activation_offload off (it pays only where memory is short)"
    if not s.checkpointing:
        return "needs gradient checkpointing"
    if s.strategy not in ("single", "ddp"):
        return f"{s.strategy} checkpoints its own way"
    if s.torch_compile:
        return "torch.compile would trace the copies"
    return None


def _sdpa_packed(s: Situation, applied: tuple[str, ...]) -> str | None:
    # A VLM's class is not read before loading (facts unknown): its default attention is transformers' SDPA
    if s.attention != "sdpa" and not (s.image_rows and s.attention == ""):
        return f"attention {s.attention or 'default'}"
    if s.image_rows and "packed_image_rows" not in applied:
        return "image rows not packed"
    if not s.facts.supports_sdpa:
        return f"{s.facts.name} refuses SDPA"
    if not s.packing:
        return "packing off (padded batches need SDPA's mask)"
    if s.torch_compile:
        return "under torch.compile per-example cuts would recompile"
    if s.facts.sliding_window:
        return "sliding-window layers need SDPA's mask"
    return None


def _packed_image_rows(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.facts.model_type in IMAGE_PACKING_REFUSED:
        return IMAGE_PACKING_REFUSED[s.facts.model_type]
    if not s.packing:
        return "packing off"
    return None


def _rank_first_lora(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.method != "lora":
        return f"{s.method} runs peft's forward"
    if s.precision != "fp32":
        return f"precision {s.precision}"
    if s.facts.hidden_size > RANK_FIRST_MAX_HIDDEN:
        return f"hidden {s.facts.hidden_size} > {RANK_FIRST_MAX_HIDDEN}, where it does not pay"
    return None


def _bf16_base(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.bf16_base:
        return None
    return "needs LoRA at precision auto" if s.native_bf16 else "no native bf16 on this CPU"


def _thread_choice(s: Situation, applied: tuple[str, ...]) -> str | None:
    if s.cpu_threads:
        return "train.cpu_threads is set"
    if s.torch_compile:
        return "torch.compile would compile twice"
    if s.world_size > 1:
        return "distributed ranks share the cores by rule"
    if s.threads <= 1:
        return "one thread to start from"
    return None


SHORTCUTS: tuple[Shortcut, ...] = (
    Shortcut("loss_positions", "logits only at the positions the loss reads (loss_positions.py)",
             ALL, frozenset({"cpu", "cuda"}), _loss_positions),
    # GPT-2's blocks are not `layers` of `mlp` + `self_attn.o_proj`; MoE: the router runs over every row.
    Shortcut("last_layer_rows", "the last layer's MLP and attention output only at those rows (last_layer_rows.py)",
             DENSE, frozenset({"cpu", "cuda"}), _last_layer_rows),
    # A GPU's memory is what it saves; on the CPU the logits are rarely what runs short.
    Shortcut("chunked_loss", "lm_head and cross-entropy a chunk of rows at a time, no full-vocabulary logits "
             "(chunked_loss.py)", ALL, frozenset({"cuda"}), _chunked_loss),
    # Copies of each layer's input, exact for every family with checkpointed decoder layers.
    Shortcut("activation_offload", "each checkpointed layer input in pinned host memory until backward "
             "(activation_offload.py)", ALL, frozenset({"cuda"}), _activation_offload),
    # Image rows: each row's pixels and 3-D positions go with it; attention per row from the restarting
    # text positions (sdpa_packed below on SDPA, a block-diagonal mask on eager, varlen bounds on FlashAttention-2).
    Shortcut("packed_image_rows", "image rows packed into one row, pixels and 3-D positions per row "
             "(vision/packed_collator.py)", PACKED_IMAGE_FAMILIES, frozenset({"cpu", "cuda"}), _packed_image_rows,
             rows=frozenset({"image"})),
    # Gemma 2 refuses SDPA (soft-capped attention logits); sliding windows keep SDPA's mask. On packed image
    # rows the text layers cut per row and the vision tower's attention passes through unchanged.
    Shortcut("sdpa_packed", "one causal SDPA per packed example, no block mask (packed_attention.py)",
             (ALL - {"gemma2"}) | PACKED_IMAGE_FAMILIES, frozenset({"cpu", "cuda"}), _sdpa_packed,
             rows=frozenset({"text", "image"})),
    # GPT-2's Conv1D bases are not nn.Linear.
    Shortcut("rank_first_lora", "LoRA's products with the rank as the rows (lora_matmul.py)",
             ALL - {"gpt2"}, frozenset({"cpu"}), _rank_first_lora),
    Shortcut("bf16_base", "the frozen base's products in bf16 (lora_matmul.py)",
             ALL - {"gpt2"}, frozenset({"cpu"}), _bf16_base, exact=False,
             tolerance="losses within 0.5% of fp32 (tests/backend/test_techniques.py)"),
    Shortcut("thread_choice", "the CPU thread count measured on one training pass (thread_choice.py)",
             ALL, frozenset({"cpu"}), _thread_choice,
             tolerance="the losses of a run pinned to the chosen count (tests/backend/test_thread_choice.py)"),
)
BY_NAME = {s.name: s for s in SHORTCUTS}


@dataclass(frozen=True)
class ShortcutChoice:
    mode: str  # auto | off
    family: str
    applied: tuple[str, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (name, why), for shortcuts that exist on this device
    proven: bool = True  # the family is one the exactness tests cover
    disabled: tuple[str, ...] = ()  # left out through DISABLE_ENV
    rows: str = "text"  # the door's rows: "image" for a run through the vision door

    def has(self, name: str) -> bool:
        return name in self.applied

    def summary(self) -> str:
        if self.mode == "off":
            return "shortcuts off (plain transformers + peft)"
        if not self.proven:
            return (f"shortcuts skipped: {self.family or 'this model'} is not a family their exactness tests "
                    "cover (plain transformers + peft)")
        text = "shortcuts " + (", ".join(self.applied) if self.applied else "none")
        if self.skipped:
            text += " (not used: " + ", ".join(f"{name}: {why}" for name, why in self.skipped) + ")"
        if self.rows == "image":  # the text door's shortcuts were proven on text rows only
            text = "image rows: " + text + "; the text rows' shortcuts are not proven on image rows"
        return text


def disabled_by_env(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    raw = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        log.warning("%s names unknown shortcuts %s (known: %s)", DISABLE_ENV, unknown, ", ".join(BY_NAME))
    return names


def choose(situation: Situation, mode: str = "auto", disabled: tuple[str, ...] | None = None) -> ShortcutChoice:
    """Which shortcuts run in this situation; in order, since one may need another (last_layer_rows)."""
    family = situation.facts.model_type
    rows = "image" if situation.image_rows else "text"
    if mode == "off":
        return ShortcutChoice("off", family, rows=rows)
    # A vision run's folder is a proven vision family already (backend/core/vision_folder.py), and its
    # shortcuts name their families one by one; a text run needs a family the text exactness tests cover.
    if rows == "text" and (not situation.facts.known or family not in ALL):
        return ShortcutChoice(mode, family, proven=False)
    disabled = disabled_by_env() if disabled is None else disabled
    applied: list[str] = []
    skipped: list[tuple[str, str]] = []
    for shortcut in SHORTCUTS:
        if situation.device not in shortcut.devices or rows not in shortcut.rows:
            continue  # not a shortcut of this device or these rows at all: the plan line need not mention it
        why = shortcut.condition(situation, tuple(applied))
        if why is None and family not in shortcut.families:
            why = f"not proven for {family}"
        if why is None and shortcut.name in disabled:
            why = f"disabled by {DISABLE_ENV}"
        if why is None:
            applied.append(shortcut.name)
        else:
            skipped.append((shortcut.name, why))
    return ShortcutChoice(mode, family, tuple(applied), tuple(skipped), True, tuple(disabled), rows)
