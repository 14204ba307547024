"""The door of `technique.objective: sft`: tokenized examples and the SupervisedCountingTrainer.

Unlike the TRL doors, SFT's trainer takes the base already wrapped in peft and a collator, because
the speed shortcuts patch that model and its trainer (backend.jobs.finetune installs them after).
"""

from __future__ import annotations

from typing import Any

from backend.training.counting_trainer import SupervisedCountingTrainer
from backend.training.tokenized import build_datasets

__all__ = ["build_datasets", "make_trainer"]


def make_trainer(model: Any, args: Any, train_set: Any, eval_set: Any, collator: Any,
                 callbacks: list[Any]) -> SupervisedCountingTrainer:
    """The transformers Trainer that counts the tokens the loss sees, on the peft-wrapped model."""
    return SupervisedCountingTrainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=collator,
        callbacks=callbacks,
    )
