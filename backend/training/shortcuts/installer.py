"""The one installer of every speed shortcut: attention at load, the model and trainer tricks, the threads.

backend.core.registries.shortcuts decides (torch-free, the estimate asks it too); this module
puts the decision in place on the loaded model and trainer, so the job has one place to call.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import torch

from backend.core.protocol import PhaseChanged
from backend.core.registries.shortcuts import ShortcutChoice
from backend.training.shortcuts.thread_choice import choose_threads, training_pass

if TYPE_CHECKING:
    from backend.training.model.techniques import TechniquePlan

log = logging.getLogger(__name__)


def attention_implementation(plan: TechniquePlan) -> str | None:
    """What `from_pretrained` is asked for: the plan's sdpa loads as `sdpa_packed` where the registry
    chose it (SDPA, but per example for packed rows: packed_attention.py); an empty plan attention
    (the class was not known before loading) leaves the choice to transformers."""
    if plan.shortcuts.has("sdpa_packed"):
        from backend.training.shortcuts.packed_attention import register

        return register()
    return plan.attention or None


def install(choice: ShortcutChoice, model: Any, trainer: Any) -> list[str]:
    """Put the chosen model-side shortcuts in place on a loaded (peft) model; returns what was installed.

    chunked_loss wraps the model's head and loss (chunked_loss.py), activation_offload its checkpointed
    layers (activation_offload.py; the Trainer turns checkpointing on later, the wrapper reads it per call);
    loss_positions and last_layer_rows act through the trainer (SupervisedCountingTrainer reads them per step);
    sdpa_packed was chosen at load time (attention_implementation below); thread_choice is
    `choose_thread_count`, measured once the trainer exists. Rank-first LoRA goes first: last_layer_rows wraps `o_proj` outermost.
    """
    from backend.training.shortcuts.activation_offload import ActivationOffload
    from backend.training.shortcuts.chunked_loss import ChunkedLoss
    from backend.training.shortcuts.last_layer_rows import LastLayerRows
    from backend.training.shortcuts.lora_matmul import LoraMatmul
    from backend.training.shortcuts.loss_positions import supports_loss_positions

    installed: list[str] = []
    rank_first, bf16 = choice.has("rank_first_lora"), choice.has("bf16_base")
    if rank_first or bf16:
        patched = LoraMatmul(bf16_base=bf16, rank_first=rank_first).install(model)
        if patched:
            installed += [n for n, on in (("rank_first_lora", rank_first), ("bf16_base", bf16)) if on]
        log.info("%d LoRA layers patched (rank-first %s, bf16 base %s)", patched, rank_first, bf16)
    if choice.has("loss_positions") and supports_loss_positions(model):
        trainer.loss_positions = True
        installed.append("loss_positions")
    if choice.has("last_layer_rows") and trainer.loss_positions:
        rows = LastLayerRows()
        if rows.install(model):
            trainer.rows = rows
            installed.append("last_layer_rows")
            log.info("last layer's %s run on the loss rows only", " and ".join(rows.modules))
    if choice.has("chunked_loss") and ChunkedLoss().install(model):
        installed.append("chunked_loss")
    if choice.has("activation_offload") and ActivationOffload(pin_memory=True).install(model):
        installed.append("activation_offload")
    return installed


def install_for_job(choice: ShortcutChoice, model: Any, trainer: Any) -> list[str]:
    """`install`, plus sdpa_packed where the model loaded with it: every shortcut in place, by name."""
    installed = install(choice, model, trainer)
    if choice.has("sdpa_packed") and getattr(model.config, "_attn_implementation", None) == "sdpa_packed":
        installed.append("sdpa_packed")
    return installed


def choose_thread_count(choice: ShortcutChoice, trainer: Any, sample: dict[str, Any], per_token_flops: float,
                        peak: float, emit: Callable[[Any], None], remeasure_peak: Callable[[], float]) -> float | None:
    """thread_choice: time one training pass at each thread count where a pass is short enough to gain.

    Returns the peak FLOP/s re-measured at the chosen count (the peak is per thread count), or None
    when the count was not measured (the shortcut is off, or the model is big enough for every thread).
    """
    if not choice.has("thread_choice"):
        return None
    fastest_pass_s = per_token_flops * int(sample["input_ids"].numel()) / peak  # at 100% MFU
    if fastest_pass_s >= 0.5:  # a bigger model uses every thread anyway
        emit(PhaseChanged(phase="threads", detail=f"{torch.get_num_threads()} CPU threads, not measured: "
                          "one pass would take 0.5 s or more, enough work for every thread"))
        return None
    emit(PhaseChanged(phase="threads", detail="measuring one training pass at each thread count"))
    picked = choose_threads(training_pass(trainer, sample), torch.get_num_threads())
    emit(PhaseChanged(phase="threads", detail=picked.summary()))
    return remeasure_peak()
