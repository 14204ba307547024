"""CountingTrainer: the transformers Trainer, counting the tokens the loss sees and naming its phase.

Counting in the collator overcounts: the dataloader is read ahead of the step that uses it. Counting
in `training_step` counts exactly what was trained on, padding and masked prompt tokens excluded, so
the tokens/s we show is the useful throughput and not an inflated one. The phase marks (forward,
backward, optimizer step, evaluation, save) let an out-of-memory say where it struck.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer, TrainerCallback

from backend.training.data import IGNORE  # one definition of the ignored label
from backend.training.last_layer_rows import LastLayerRows
from backend.training.loss_positions import keep_loss_positions, supports_loss_positions
from backend.training.phase import set_phase


class PhaseCallback(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        set_phase("optimizer step")


class CountingTrainer(Trainer):
    trained_tokens: int = 0
    input_tokens: int = 0  # every non-padding token the model computes on (what MFU counts)
    rows: LastLayerRows | None = None
    """Set by the job where the last layer may run on the loss rows only (last_layer_rows.py)."""

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None):
        labels = inputs.get("labels")
        if labels is not None:
            # The model shifts labels by one: the first position never enters the loss.
            self.trained_tokens += int((labels[..., 1:] != IGNORE).sum())
        mask = inputs.get("attention_mask")
        self.input_tokens += int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
        set_phase("forward", self.state.global_step + 1)
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:  # the rows hold for forward and backward (checkpoint recomputation) of this step only
            if self.rows is not None:
                self.rows.mask = None

    _loss_positions: bool | None = None

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any):
        if self._loss_positions is None:
            # Liger's fused linear cross-entropy already skips the full logits; NEFTune and the rest are unaffected.
            self._loss_positions = not self.args.use_liger_kernel and supports_loss_positions(model)
        if model.training and self._loss_positions and not kwargs.get("return_outputs"):
            inputs = keep_loss_positions(inputs)  # logits only where the loss looks: same loss, less work
            if self.rows is not None:
                self.rows.mask = inputs.get("logits_to_keep")
        result = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training:
            set_phase("backward")
        return result

    def evaluate(self, *args: Any, **kwargs: Any):
        set_phase("evaluation")
        return super().evaluate(*args, **kwargs)

    def _save_checkpoint(self, *args: Any, **kwargs: Any):
        set_phase("save checkpoint")
        return super()._save_checkpoint(*args, **kwargs)
