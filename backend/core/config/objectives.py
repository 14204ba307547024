"""The settings of the objectives beyond supervised tuning: KTO's and GRPO's sections and GRPO's rewards.

Apart from config.py so that each objective's knobs read together; RunConfig holds them as the `kto`
and `grpo` sections (DPO's two knobs, dpo_beta and dpo_loss, live in `technique`, where they came
first). Torch-free: the studio builds its objective controls from these models.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from backend.core.config.base import Section

REWARD_KINDS = ("exact_match", "regex", "length", "valid_json", "banned", "python")
"""Built-in reward functions (backend.training.objectives.rewards) and `python`, the person's own file."""


class RewardSpec(Section):
    kind: Literal["exact_match", "regex", "length", "valid_json", "banned", "python"]
    """exact_match: 1 when the completion's final answer (after its last ####, inside its last \\boxed{}, else its last line) equals the record's `column` (case and surrounding punctuation ignored), else 0; regex: 1 when `pattern` matches the completion; length: 1 at `target` characters, falling linearly to 0 at twice or zero that; valid_json: 1 when the completion parses as JSON; banned: 1 minus the share of `strings` it contains; python: `function` from the Python file `file` with TRL's reward signature (prompts, completions, **columns) -> list of floats, loaded in the worker only."""
    weight: float = 1.0
    """How much this function counts in the reward GRPO ranks a prompt's completions by (the weighted sum)."""
    column: str = "answer"
    """exact_match: the data column holding each prompt's known answer."""
    pattern: str = ""
    """regex: the regular expression a well-formatted completion matches (Python re.search)."""
    target: int = Field(default=0, ge=0)
    """length: the completion length, in characters, that earns the full reward."""
    strings: list[str] = Field(default_factory=list)
    """banned: strings a completion should not contain."""
    file: str = ""
    """python: the .py file that defines the function (a relative path is from the current folder, as data.path; the run stores it absolute)."""
    function: str = ""
    """python: the function's name in that file."""

    @model_validator(mode="after")
    def _kind_needs(self) -> "RewardSpec":
        if self.kind == "regex":
            if not self.pattern:
                raise ValueError("a regex reward needs pattern, the expression a good completion matches")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"the regex reward's pattern {self.pattern!r} does not compile: {exc}") from None
        if self.kind == "length" and self.target < 1:
            raise ValueError("a length reward needs target, the length in characters to aim for (1 or more)")
        if self.kind == "banned" and not [s for s in self.strings if s]:
            raise ValueError("a banned reward needs strings, the texts a completion should not contain")
        if self.kind == "python" and (not self.file or not self.function):
            raise ValueError("a python reward needs file (the .py file) and function (the name of the function in it)")
        if self.kind == "exact_match" and not self.column:
            raise ValueError("an exact_match reward needs column, the data column with the known answer")
        return self

    def label(self) -> str:
        """The name its charts and samples show: the kind, or the function of a python reward."""
        return self.function if self.kind == "python" else self.kind


class KtoSection(Section):
    beta: float = Field(default=0.1, gt=0)
    """How far the tuned model may move from the reference (the base with the adapters off); 0.1 is typical."""
    desirable_weight: float = Field(default=1.0, gt=0)
    """Weight of the answers labelled good; raise it when good answers are much rarer than bad ones."""
    undesirable_weight: float = Field(default=1.0, gt=0)
    """Weight of the answers labelled bad."""


class GrpoSection(Section):
    num_generations: int = Field(default=4, ge=2, le=64)
    """Completions sampled per prompt; GRPO scores each against the others of its prompt, so more gives a steadier signal and costs that many generations per prompt."""
    max_completion_length: int = Field(default=32, ge=1, le=32768)
    """Most tokens generated per completion; longer answers are cut (and memory for the KV cache grows with it)."""
    temperature: float = Field(default=1.0, gt=0, le=4.0)
    """Sampling temperature of the completions: higher explores more (more different answers per prompt)."""
    loss: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo"] = "dapo"
    """TRL's loss_type. How token losses are averaged: dapo over the tokens of the whole batch (TRL's default, no length bias); grpo per completion (the paper's, favours short right answers); dr_grpo by a constant (Dr. GRPO); bnpo over the tokens of the local batch. Other objectives: cispo clips the importance weights rather than the update (MiniMax-M1); sapo a soft, temperature-controlled gate instead of clipping; luspo a sequence-level loss scaled by each completion's length (importance sampling per sequence, as its paper)."""
    beta: float = Field(default=0.0, ge=0)
    """KL penalty toward the reference (the base with the adapters off): 0 skips the reference pass (TRL's default); 0.001-0.04 keeps the model near its base and charts the KL."""
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(kind="exact_match")])
    """The reward functions and their weights; the reward of a completion is their weighted sum."""

    @model_validator(mode="after")
    def _some_reward(self) -> "GrpoSection":
        if not self.rewards:
            raise ValueError("grpo.rewards is empty: GRPO needs at least one reward function, e.g. "
                             "- {kind: exact_match, column: answer}")
        return self


Objective = Literal["sft", "dpo", "kto", "grpo"]
