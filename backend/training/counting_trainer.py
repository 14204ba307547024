"""CountingTrainer: the transformers Trainer, counting the tokens the loss actually sees.

Counting in the collator overcounts: the dataloader is read ahead of the step that uses it. Counting
in `training_step` counts exactly what was trained on, padding and masked prompt tokens excluded, so
the tokens/s we show is the useful throughput and not an inflated one.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer

IGNORE = -100


class CountingTrainer(Trainer):
    trained_tokens: int = 0

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None):
        labels = inputs.get("labels")
        if labels is not None:
            # The model shifts labels by one: the first position never enters the loss.
            self.trained_tokens += int((labels[..., 1:] != IGNORE).sum())
        return super().training_step(model, inputs, num_items_in_batch)
