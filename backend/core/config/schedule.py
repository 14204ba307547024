"""The `train` section, and the schedule a run follows: its length in steps or epochs, its learning rate.

Apart from run_config.py so the length rules read on one screen: exactly one of max_steps and
num_epochs sets the length, the one given on the command line (or in the window) replaces the file's
other, and the steps an epoch count comes to are derived here for the worker (which knows the rows)
and the window (which approximates them). Torch-free: the studio imports this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, model_validator

from backend.core.config.base import Section
from backend.core.config.errors import ConfigError

ALTERNATIVES: dict[str, tuple[str, Any]] = {
    "train.num_epochs": ("train.max_steps", None),
    "train.max_steps": ("train.num_epochs", None),
    "train.warmup_ratio": ("train.warmup_steps", 0),
    "train.warmup_steps": ("train.warmup_ratio", 0.0),
}
"""Fields that say the same thing two ways: setting one (to other than its off value) turns its
partner off, so `--set train.num_epochs=2` on a preset with max_steps trains two epochs."""
OFF: dict[str, Any] = dict(ALTERNATIVES.values())
"""Each alternative's off value: null for a length, 0 for a warmup."""


class TrainSection(Section):
    max_steps: int | None = Field(default=60, ge=1)
    """Optimizer steps to run; null when train.num_epochs sets the length instead (exactly one of the two is set; setting one with --set or in the window turns the other off)."""
    num_epochs: int | None = Field(default=None, ge=1, le=10_000)
    """Passes over the training rows, instead of max_steps (in a file write max_steps: null beside it; --set train.num_epochs=N replaces a file's max_steps): steps = ceil(rows / (micro_batch_size x gradient_accumulation_steps x processes)) x epochs, rows counted after the validation split and what training drops (GRPO: prompts x num_generations); the worker's schedule line says the steps."""
    micro_batch_size: int = Field(default=8, ge=1)
    """Examples per forward pass. Memory for activations grows linearly with it."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Forward passes per optimizer step: a larger effective batch without more activation memory."""
    learning_rate: float = Field(default=2e-3, gt=0, le=1.0)
    """Peak learning rate, reached after the warmup; train.lr_scheduler shapes it from there."""
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "linear"
    """The learning rate after the warmup: linear falls straight to zero at the last step; cosine falls along a half cosine (slower at the start and the end); constant_with_warmup holds the peak (without warmup, constant)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warmup from zero (0: none); or give train.warmup_ratio instead, not both."""
    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Warmup as a share of the run's steps (0.03-0.1 is common; rounded up as transformers does), instead of warmup_steps; it follows the derived length when num_epochs rules."""
    max_grad_norm: float = Field(default=1.0, ge=0.0)
    """Clip the gradients to this total norm before each optimizer step (1.0, transformers' default, keeps a bad batch from throwing the weights far); 0 turns clipping off."""
    weight_decay: float = Field(default=0.0, ge=0.0)
    """AdamW weight decay."""
    seq_len: int = Field(default=256, ge=8, le=1_048_576)
    """Longest example in tokens; longer ones are truncated or refused (see data.truncate)."""
    save_steps: int = Field(default=50, ge=1)
    """Write a complete, resumable checkpoint every N steps."""
    save_total_limit: int | None = Field(default=2, ge=1)
    """Keep only the newest N checkpoints (None keeps all)."""
    logging_steps: int = Field(default=1, ge=1)
    """Report loss every N steps; 1 makes the chart move every step."""
    eval_steps: int = Field(default=0, ge=0)
    """Evaluate on the validation split every N steps (0: only at the end)."""
    seed: int = 42
    """Seed for weights of new adapters, data order and dropout: same seed, same run."""
    cpu_threads: int = Field(default=0, ge=0)
    """Torch CPU threads; 0 means measured: at most all cores but one (the desktop stays
    responsive), fewer where one training pass of this model runs faster on fewer (thread_choice.py)."""

    @model_validator(mode="before")
    @classmethod
    def _epochs_alone(cls, data: Any) -> Any:
        # `num_epochs: 2` alone in a file: max_steps' default must not make it "both"
        if isinstance(data, dict) and data.get("num_epochs") is not None and "max_steps" not in data:
            return {**data, "max_steps": None}
        return data

    @model_validator(mode="after")
    def _one_length(self) -> "TrainSection":
        if self.max_steps is None and self.num_epochs is None:
            raise ValueError("train.max_steps and train.num_epochs are both null: set one, e.g. "
                             "train.max_steps: 60 or train.num_epochs: 1")
        if self.max_steps is not None and self.num_epochs is not None:
            raise ValueError(f"train.max_steps {self.max_steps} and train.num_epochs {self.num_epochs} both set the "
                             "run's length: keep one and set the other to null")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise ValueError(f"train.warmup_steps {self.warmup_steps} and train.warmup_ratio {self.warmup_ratio} both "
                             "set the warmup: keep one and set the other to 0")
        if warmup_outlasts(self.warmup_steps, self.max_steps):
            raise ValueError(warmup_problem(self.warmup_steps, f"train.max_steps {self.max_steps}",
                                            "raise train.max_steps"))
        return self


def alternative_to_clear(key: str, value: Any) -> tuple[str, Any] | None:
    """(partner, its off value) when setting `key` to `value` turns another field off, else None."""
    if key not in ALTERNATIVES or value is None or value == OFF[key]:
        return None
    return ALTERNATIVES[key]


def clear_alternatives(raw: dict[str, Any], keys: list[str]) -> None:
    """The command line wins over the file: for each key set in `keys`, the file's partner is turned off
    (unless `keys` sets the partner too, which the section's own check then judges)."""
    train = raw.get("train")
    if not isinstance(train, dict):
        return
    for key in keys:
        cleared = alternative_to_clear(key, train.get(key.split(".", 1)[1])) if key.startswith("train.") else None
        if cleared is None or cleared[0] in keys:
            continue
        name = cleared[0].split(".", 1)[1]
        if train.get(name) not in (cleared[1], None):
            train[name] = cleared[1]


def held_out(examples: int, validation_split: float) -> int:
    """Examples the validation split takes from `examples`: the share rounded down, but at least one from
    four examples up, so a split asked for is never empty (the worker's split and the window's count)."""
    count = int(examples * validation_split)
    return 1 if validation_split > 0 and count == 0 and examples >= 4 else count


def warmup_outlasts(warmup_steps: Any, max_steps: Any) -> bool:
    """The one warmup rule, for the CLI and the window: a warmup of max_steps or more never reaches
    the peak learning rate, so it is refused (0 is no warmup). Values that are not ints are left to
    the field checks (and a null max_steps to the worker, which derives the steps)."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (warmup_steps, max_steps))
    return ints and warmup_steps > 0 and warmup_steps >= max_steps


def warmup_problem(warmup_steps: int, length: str, fix: str) -> str:
    """The sentence for a warmup that outlasts the run (`length`, e.g. "train.max_steps 5"), with the fixes."""
    return (f"train.warmup_steps {warmup_steps} must be below {length}; "
            f"set train.warmup_steps=0 (no warmup) or a smaller number, or {fix}")


@dataclass(frozen=True)
class Schedule:
    """The steps a run takes and how its learning rate moves, as the worker passes them to the Trainer."""

    steps: int
    warmup: int
    rows: int
    """Training rows one epoch goes through (GRPO: completions, prompts x num_generations)."""
    micro_batch: int
    accumulation: int
    processes: int
    epochs: int | None
    """The epochs asked for; None when max_steps rules."""
    scheduler: str
    max_grad_norm: float
    rows_note: str = ""
    """What a row is, where it is not one example (GRPO: "10 prompts x 4 generations")."""

    @property
    def rows_per_step(self) -> int:
        return self.micro_batch * self.accumulation * self.processes

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.rows / self.rows_per_step)

    def describe(self) -> str:
        """One line: which field rules, the steps it comes to, and the learning rate's shape."""
        rows = f"{self.rows:,} rows" + (f" ({self.rows_note})" if self.rows_note else "")
        if self.epochs is not None:
            length = (f"train.num_epochs rules: {self.epochs} epoch{'s' if self.epochs != 1 else ''} of {rows} = "
                      f"{self.steps:,} steps")
        else:
            epochs = self.steps / self.steps_per_epoch
            length = f"train.max_steps rules: {self.steps:,} steps = {epochs:.3g} epochs of {rows}"
        warmup = f"warmup {self.warmup} step{'s' if self.warmup != 1 else ''}" if self.warmup else "no warmup"
        clip = f"gradients clipped at norm {self.max_grad_norm:g}" if self.max_grad_norm > 0 else "no gradient clipping"
        batch = (f"{self.rows_per_step} rows a step: micro-batch {self.micro_batch} x accumulation {self.accumulation}"
                 f" x {self.processes} process{'es' if self.processes != 1 else ''}")
        return f"{length} ({batch}); {self.scheduler} learning rate, {warmup}, {clip}"


def plan_schedule(train: TrainSection, rows: int, processes: int, rows_note: str = "") -> Schedule:
    """The schedule over `rows` training rows on `processes` processes; a warmup the derived length
    cannot hold raises ConfigError with the sentence to show."""
    rows = max(rows, 1)
    epochs = train.num_epochs if train.max_steps is None else None  # the section holds exactly one of them
    per_epoch = math.ceil(rows / (train.micro_batch_size * train.gradient_accumulation_steps * processes))
    steps = train.max_steps if epochs is None else per_epoch * epochs
    warmup = train.warmup_steps or math.ceil(steps * train.warmup_ratio)
    if epochs is not None and warmup_outlasts(train.warmup_steps, steps):  # (max_steps' own is refused on load)
        raise ConfigError(warmup_problem(train.warmup_steps, f"the {steps} steps train.num_epochs {epochs} comes to "
                                         f"on {rows:,} rows", "raise train.num_epochs or use train.warmup_ratio"))
    return Schedule(steps, warmup, rows, train.micro_batch_size, train.gradient_accumulation_steps, processes,
                    epochs, train.lr_scheduler, train.max_grad_norm, rows_note)
