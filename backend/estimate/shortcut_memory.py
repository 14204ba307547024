"""What the memory-saving shortcuts change in the estimate: the chunked loss and activation offload.

The worker's registry (backend/core/registries/shortcuts.py, torch-free) decides where each runs; the same
conditions are read here so that the estimate counts what the worker will hold:

- chunked_loss: lm_head and the cross-entropy run a chunk of rows at a time, so the logits part is
  one chunk's elements at the plain logits' per-element cost instead of the whole micro-batch's
  (the chunk's gradient is taken while its log-probabilities are saved, the same buffers as the
  plain backward; bench/loss_memory.py measures it on the CPU, docs/benchmarks.md).
- activation_offload: with checkpointing, each layer's checkpointed input (the hidden states) waits
  for the backward pass in pinned host memory: those bytes leave the GPU's activations and are
  reported as `host_offloaded` in the activations' details.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from backend.core.config.run_config import RunConfig

if TYPE_CHECKING:
    from backend.estimate.setup import Setup


def _applies(name: str, run: RunConfig, model_type: str, device: str) -> bool:
    """The registry's verdict for shortcut `name`, from what the estimate knows (no model class)."""
    from backend.core.registries.shortcuts import BY_NAME, disabled_by_env

    shortcut = BY_NAME.get(name)
    t = run.technique
    if shortcut is None or t.shortcuts != "auto" or t.objective != "sft" or name in disabled_by_env():
        return False
    if device not in shortcut.devices or model_type not in shortcut.families:
        return False
    situation = SimpleNamespace(liger_kernel=t.liger_kernel, torch_compile=t.torch_compile,
                                strategy=run.hardware.strategy, checkpointing=t.gradient_checkpointing,
                                activation_offload=getattr(t, "activation_offload", False))
    return shortcut.condition(situation, ()) is None  # type: ignore[arg-type]


def held_logit_elements(run: RunConfig, model_type: str, vocab: int, elements: int, device: str) -> int:
    """The logit elements one step holds at once: all of them, or one chunk's (chunked_loss)."""
    if run.technique.liger_kernel or not _applies("chunked_loss", run, model_type, device):
        return elements
    from backend.core.registries.shortcuts import loss_chunk_rows

    return min(elements, loss_chunk_rows(vocab) * vocab)


def offload_activations(act: dict[str, Any], run: RunConfig, model_type: str, setup: "Setup", layers: int) -> dict[str, Any]:
    """The activations with activation_offload's layer inputs in host memory (unchanged where it does not run).

    All but one: the layer being recomputed has its input back on the GPU. What int8 matmuls keep
    as ctx attributes stays (it is not saved through the hooks)."""
    if not setup.checkpointing or not _applies("activation_offload", run, model_type, setup.device):
        return act
    moved = max(0, layers - 1) * act["layer_input"]
    return {**act, "total": act["total"] - moved, "checkpointed_inputs": act["checkpointed_inputs"] - moved,
            "host_offloaded": moved}
