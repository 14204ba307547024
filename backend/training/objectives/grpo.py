"""GRPO: prompts read and checked, the reward functions built, and TRL's GRPOTrainer on any method.

The door of `technique.objective: grpo` (backend.training.objectives.registry). Data: records with a `prompt`
(text, or a list of chat messages) and any other columns, which reach the reward functions by name
(exact_match reads `answer` by default). For each prompt TRL samples grpo.num_generations completions,
scores them with the weighted rewards, and reinforces those above their group's mean. The reference
for the KL term (grpo.beta > 0) is the base with the adapters off (with full tuning, a frozen copy TRL
loads). A few completions of every generation, with what each reward gave them, go to the window as
CompletionScored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.protocol import CompletionScored
from backend.core.data.long_fields import cut_long_fields
from backend.training.tokenized import split_rows
from backend.core.data.prompt_records import read_prompts
from backend.training.objectives.rewards import RewardFn, completion_text, reward_functions
from backend.training.objectives.trl_counting import build_trl_trainer

SAMPLES_PER_GENERATION = 3
"""Completions of one prompt shown per generation: enough to see the group's scores differ."""


@dataclass
class PromptStats:
    examples: int
    train_examples: int
    eval_examples: int
    format: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def as_trl_row(row: dict[str, Any], chat: bool, where: str) -> dict[str, Any]:
    """One record as TRL reads it: a text prompt becomes a user turn where the model has a chat template."""
    prompt = row["prompt"]
    if isinstance(prompt, list) and not chat:
        raise bad_input(f"{where}: chat-message prompts need a model with a chat template, and this one has none",
                        "write the prompts as text, or use a model whose tokenizer has a chat template")
    if isinstance(prompt, str) and chat:
        prompt = [{"role": "user", "content": prompt}]
    return dict(row, prompt=prompt)


def build_datasets(config: RunConfig, tokenizer: Any) -> tuple[Any, Any, PromptStats]:
    """-> (train, validation or None, stats): the split is the SFT job's (seeded shuffle, data.validation_split)."""
    from datasets import Dataset

    path = config.resolved_data_path()
    columns = tuple(dict.fromkeys(r.column for r in config.grpo.rewards if r.kind == "exact_match"))
    records = read_prompts(path, columns, config.data.max_examples)
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows, cut = cut_long_fields([as_trl_row(r, chat, str(path)) for r in records], config.train.seq_len)
    train_rows, eval_rows = split_rows(config, rows)
    fmt = "prompts" + (" (chat template)" if chat else " (text)")
    stats = PromptStats(len(rows), len(train_rows), len(eval_rows), fmt, (cut,) if cut else ())
    return Dataset.from_list(train_rows), (Dataset.from_list(eval_rows) if eval_rows else None), stats


class ScoreBoard:
    """Wraps the reward functions: passes their scores on to TRL and, once the last has scored a
    generation, reports a few completions of its first prompt with every function's score."""

    def __init__(self, functions: list[RewardFn], weights: list[float], reporter: Any, generations: int):
        self.functions, self.weights, self.reporter = functions, weights, reporter
        self.generations = generations
        self.scores: dict[int, list[Any]] = {}
        self.trainer: Any = None  # set once built: evaluation's generations are not reported

    def wrapped(self) -> list[RewardFn]:
        return [self._wrap(i, fn) for i, fn in enumerate(self.functions)]

    def _wrap(self, index: int, fn: RewardFn) -> RewardFn:
        def scored(prompts: list, completions: list, **columns: Any) -> list[float]:
            result = fn(prompts=prompts, completions=completions, **columns)
            self.scores[index] = list(result)
            if index == len(self.functions) - 1:
                self._report(prompts, completions, columns.get("trainer_state"))
            return result
        scored.__name__ = fn.__name__
        return scored

    def _report(self, prompts: list, completions: list, state: Any) -> None:
        model = getattr(self.trainer, "model", None)
        if self.reporter is None or (state is not None and not state.is_world_process_zero) or \
                (model is not None and not model.training):
            self.scores = {}
            return
        step = (state.global_step + 1) if state is not None else 0
        for i in range(min(SAMPLES_PER_GENERATION, self.generations, len(completions))):
            rewards = {fn.__name__: self.scores[k][i] for k, fn in enumerate(self.functions)
                       if self.scores.get(k) and self.scores[k][i] is not None}
            total = sum(self.weights[k] * self.scores[k][i] for k in range(len(self.functions))
                        if self.scores.get(k) and self.scores[k][i] is not None)
            self.reporter.emit(CompletionScored(step=step, prompt=completion_text(prompts[i])[-500:],
                                                completion=completion_text(completions[i])[:1000],
                                                rewards=rewards, reward=total))
        self.scores = {}


def grpo_config(config: RunConfig, arguments: dict[str, Any]) -> Any:
    """TRL's GRPOConfig: the SFT job's TrainingArguments plus GRPO's own settings."""
    from trl import GRPOConfig

    grpo = config.grpo
    arguments = dict(arguments, train_sampling_strategy="random")  # group_by_length reads input_ids, absent here
    return GRPOConfig(
        **arguments,
        num_generations=grpo.num_generations,
        max_completion_length=grpo.max_completion_length,
        temperature=grpo.temperature,
        loss_type=grpo.loss,
        importance_sampling_level="sequence" if grpo.loss == "luspo" else "token",
        beta=grpo.beta,
        reward_weights=[r.weight for r in grpo.rewards],
        disable_dropout=config.technique.lora_dropout == 0.0,
        log_completions=False,  # CompletionScored reports them
        shuffle_dataset=True,
    )


def make_trainer(config: RunConfig, base: Any, lora: Any, tokenizer: Any, train_set: Any, eval_set: Any,
                 arguments: dict[str, Any], callbacks: list[Any], reporter: Any = None) -> Any:
    """The GRPO trainer on `base` (loaded, not yet wrapped) with the adapter `lora`."""
    from trl import GRPOTrainer

    functions = reward_functions(config.grpo.rewards, Path.cwd())
    board = ScoreBoard(functions, [r.weight for r in config.grpo.rewards], reporter, config.grpo.num_generations)
    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = build_trl_trainer(GRPOTrainer, config, base, lora, tokenizer, train_set, eval_set, callbacks,
                                reward_funcs=board.wrapped(), args=grpo_config(config, arguments))
    board.trainer = trainer  # the board skips the evaluation's generations
    return trainer
