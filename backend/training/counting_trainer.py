"""SupervisedCountingTrainer: the transformers Trainer, counting the tokens the loss sees and naming its phase.

Counting in the collator overcounts: the dataloader is read ahead of the step that uses it. Counting
in `training_step` counts exactly what was trained on, padding and masked prompt tokens excluded, so
the tokens/s we show is the useful throughput and not an inflated one. The phase marks (forward,
backward, optimizer step, evaluation, save) let an out-of-memory say where it struck.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from backend.training.tokenized import IGNORE  # one definition of the ignored label
from backend.training.shortcuts.last_layer_rows import LastLayerRows
from backend.training.shortcuts.loss_positions import keep_loss_positions
from backend.training.phase import set_phase


class PhaseCallback(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        set_phase("optimizer step")


def image_rows(images: torch.Tensor, position_ids: torch.Tensor | None) -> int:
    """Rows holding an image token; in a packed row of image rows (4-line position ids, the first the text
    positions restarting at 0 per row: vision/packed_collator.py) each packed row counts on its own."""
    if position_ids is None or position_ids.dim() != 3 or position_ids.shape[0] != 4:
        return int(images.any(dim=-1).sum())
    row = (position_ids[0] == 0).cumsum(-1)  # which packed row each token belongs to
    return int(torch.unique(row[images]).numel())


class SupervisedCountingTrainer(Trainer):
    trained_tokens: int = 0
    input_tokens: int = 0  # every non-padding token the model computes on (what MFU counts)
    head_tokens: int = 0  # of those, the positions whose logits are computed (all, without loss_positions)
    row_tokens: int = 0  # the rows the last layer's MLP and o_proj ran on (all, without last_layer_rows)
    loss_positions: bool = False
    """Set by the job where the registry chose it (shortcuts.py): logits only at the loss positions."""
    rows: LastLayerRows | None = None
    """Set by the job where the last layer may run on the loss rows only (last_layer_rows.py)."""
    image_token_id: int | None = None
    """Set by the vision door (backend/training/vision): then image rows and image tokens are counted too."""
    image_rows: int = 0
    image_tokens: int = 0

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None):
        labels = inputs.get("labels")
        targets = 0
        if labels is not None:
            # The model shifts labels by one: the first position never enters the loss.
            targets = int((labels[..., 1:] != IGNORE).sum())
            self.trained_tokens += targets
        if self.image_token_id is not None:
            images = inputs["input_ids"] == self.image_token_id
            self.image_rows += image_rows(images, inputs.get("position_ids"))
            self.image_tokens += int(images.sum())
        mask = inputs.get("attention_mask")
        computed = int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
        self.input_tokens += computed
        # keep_loss_positions keeps exactly the target positions (or all of them when there is none)
        kept = targets if self.loss_positions and targets else computed
        self.head_tokens += kept
        self.row_tokens += kept if self.rows is not None else computed
        set_phase("forward", self.state.global_step + 1)
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:  # the rows hold for forward and backward (checkpoint recomputation) of this step only
            if self.rows is not None:
                self.rows.mask = None

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any):
        if model.training and self.loss_positions and not kwargs.get("return_outputs"):
            inputs = keep_loss_positions(inputs)  # logits only where the loss looks: same loss, less work
            if self.rows is not None:
                self.rows.mask = inputs.get("logits_to_keep")
        result = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training:
            set_phase("backward")
        return result

    # Per-step bookkeeping that walks the whole module tree (peft's ~340 modules on the bundled model)
    # for numbers that do not change during a run: 1.7 ms of a 57 ms step, measured. Counted once.
    _flos_parameters: int | None = None
    _trained_parameters: list | None = None

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """The Trainer's own estimate (6 x input tokens x non-embedding parameters), the count cached."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        if self._flos_parameters is None:
            self._flos_parameters = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main].numel() * self._flos_parameters

    def _clip_grad_norm(self, model: Any):
        """The same norm over the parameters that can have gradients, without re-walking the frozen ones.
        FSDP and DeepSpeed keep the Trainer's path: their clipping must see the wrapped model's own list."""
        if self.is_fsdp_enabled or self.is_deepspeed_enabled or self._has_mixed_mesh_grads(model):
            return super()._clip_grad_norm(model)
        if self._trained_parameters is None:
            self._trained_parameters = [p for p in model.parameters() if p.requires_grad]
        return self.accelerator.clip_grad_norm_(self._trained_parameters, self.args.max_grad_norm)

    def evaluate(self, *args: Any, **kwargs: Any):
        set_phase("evaluation")
        return super().evaluate(*args, **kwargs)

    def _save_checkpoint(self, *args: Any, **kwargs: Any):
        set_phase("save checkpoint")
        return super()._save_checkpoint(*args, **kwargs)
