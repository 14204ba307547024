"""Every training objective in one typed registry, SFT included, in the manner of PEFT's method registry.

Each objective names the module (its "door") that holds `build_datasets(config, tokenizer) -> (train,
validation or None, stats)` and its trainer builder. The doors import torch and TRL, so they load on
first use: this module stays torch-free. backend.jobs.finetune reads `objective_method(name)` only;
a new objective is one `register_objective` line and its door (docs/architecture.md, "An objective").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class ObjectiveMethod:
    """One `technique.objective`: where its door lives and how its trainer takes the model."""

    name: str
    door_module: str  # build_datasets and the trainer builder live here
    trainer: str  # the trainer class that runs it (for the reader; the door builds it)
    through_trl: bool  # True: TRL takes the bare base plus the peft config; False: the job wraps the base (SFT)

    def door(self) -> ModuleType:
        """The door module, imported on first use (it imports torch and TRL)."""
        return importlib.import_module(self.door_module)


OBJECTIVES: dict[str, ObjectiveMethod] = {}


def register_objective(method: ObjectiveMethod) -> None:
    """Add an objective; a name registered twice is a programming error."""
    if method.name in OBJECTIVES:
        raise ValueError(f"objective {method.name!r} is registered twice")
    OBJECTIVES[method.name] = method


register_objective(ObjectiveMethod("sft", "backend.training.objectives.sft", "SupervisedCountingTrainer", False))
register_objective(ObjectiveMethod("dpo", "backend.training.objectives.dpo", "trl.DPOTrainer", True))
register_objective(ObjectiveMethod("kto", "backend.training.objectives.kto", "trl.KTOTrainer", True))
register_objective(ObjectiveMethod("grpo", "backend.training.objectives.grpo", "trl.GRPOTrainer", True))


def objective_method(objective: str) -> ObjectiveMethod:
    """The registered method of `objective` (sft, dpo, kto or grpo)."""
    return OBJECTIVES[objective]


def door(objective: str) -> ModuleType:
    """The module that trains `objective`."""
    return objective_method(objective).door()
