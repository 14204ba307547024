"""Logits only where the loss looks: the vocabulary projection skipped for masked positions.

With prompts masked out of the loss, most positions of an instruction batch are context: the model
needs their hidden states, but not their logits. Projecting every position onto the vocabulary and
taking a log-softmax over it (then back-propagating through both) was a third of a CPU training step
on the bundled model, for positions whose loss is multiplied by zero. transformers' `logits_to_keep`
takes a boolean (batch, sequence) mask, so the model projects only the kept positions and its own
loss function, given `shift_labels` for them, computes the same mean over the same targets: the loss
and the gradients are those of the full computation (tests hold them to 1e-5), only cheaper.

This is what fused linear cross-entropy does for memory on CUDA, done in the plainest way: it works
on every device and every causal LM whose forward takes `logits_to_keep`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from backend.training.tokenized import IGNORE  # one definition of the ignored label


def supports_loss_positions(model: Any) -> bool:
    """True when the model's forward takes `logits_to_keep` as a boolean mask (transformers 5 models)."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401  (the mask-aware slicer)
    except ImportError:
        return False
    inner, seen = model, set()
    while inner is not None and id(inner) not in seen:  # DDP and peft wrap the model; a model's base_model may be itself
        if "logits_to_keep" in _parameters(inner):
            return True
        seen.add(id(inner))
        inner = next((getattr(inner, a) for a in ("module", "model", "base_model") if getattr(inner, a, None) is not None
                      and id(getattr(inner, a)) not in seen), None)
    return False


def _parameters(model: Any) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return set()


def keep_loss_positions(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rewrite a batch so that the model computes logits only at positions whose next token is a target.

    Position t predicts token t+1, so the kept mask is `labels[:, 1:] != -100` shifted back by one;
    the targets go in as `shift_labels`, already aligned, and `labels` stays so that the model takes
    its loss path.
    """
    labels = inputs.get("labels")
    if labels is None or labels.dim() != 2 or labels.shape[1] < 2:
        return inputs
    targets = labels[:, 1:]
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = targets != IGNORE
    if not bool(keep.any()):
        return inputs  # nothing to learn in this batch: let the model return its usual zero-target loss
    return {**inputs, "logits_to_keep": keep, "shift_labels": targets[keep[:, :-1]]}
