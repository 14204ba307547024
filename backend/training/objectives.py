"""The doors of the objectives beyond SFT: one module per objective, each with the same two functions.

`build_datasets(config, tokenizer) -> (train, validation or None, stats)` reads and checks the data
(stats has examples, train_examples, eval_examples, format, notes); `make_trainer(config, base, lora,
tokenizer, train_set, eval_set, arguments, callbacks, reporter)` builds the TRL trainer on the loaded,
unwrapped base and the peft config. backend.jobs.finetune goes through `door(objective)` only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

DOORS = {
    "dpo": "backend.training.preference",
    "kto": "backend.training.kto",
    "grpo": "backend.training.grpo",
}


def door(objective: str) -> ModuleType:
    """The module that trains `objective` (dpo, kto or grpo)."""
    return importlib.import_module(DOORS[objective])
