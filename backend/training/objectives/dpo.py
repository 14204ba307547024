"""DPO: preference pairs read and checked, and TRL's DPOTrainer built on any method.

The door of `technique.objective: dpo` (backend.training.objectives.registry: build_datasets, make_trainer). Data:
preference pairs in any shape backend.core.data.preference_shapes reads (prompt, chosen and rejected as
text or chat messages; LLaMA-Factory's ranking format), from JSONL, JSON, CSV, Parquet, ... as for SFT,
a malformed one refused with its line and the missing field. Where the tokenizer has a chat template
the pair goes to TRL as a conversation (the prompt a user turn, each answer an assistant turn), so the
tuned model is trained as it will be prompted in chat; without one, as plain text.

The reference model is the base with the adapters switched off: TRL wraps the base with our peft
LoraConfig itself (passing an already wrapped model would make it copy the adapter as a "ref"
adapter), so no second copy of the weights is loaded; with full tuning TRL loads a frozen copy. Run folder, events, checkpoints and
stop-and-save are the SFT job's: DPOTrainer is a transformers Trainer and ReportingCallback watches it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.data import preference_shapes
from backend.core.data.long_fields import cut_long_fields
from backend.training.tokenized import split_rows
from backend.training.objectives.trl_counting import build_trl_trainer

log = logging.getLogger(__name__)

LABEL_SMOOTHING = {"robust": 0.1, "exo_pair": 1e-3}
"""The smoothing the Robust DPO and EXO papers recommend; TRL refuses exo_pair without one."""


@dataclass
class PreferenceStats:
    examples: int
    train_examples: int
    eval_examples: int
    format: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def read_pairs(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Every record as {prompt, chosen, rejected} (text, or chat messages), in order; the first malformed
    one is refused in one line that names the file, the line and the field (backend.core.data.preference_shapes)."""
    return preference_shapes.read_pairs(path, limit)


def as_trl_example(pair: dict[str, Any], chat: bool, path: Path | str = "data.path") -> dict[str, Any]:
    """One pair as TRL reads it: conversational (rendered through the model's chat template) or text."""
    return preference_shapes.as_trl_row(pair, chat, Path(path))


def build_preference_datasets(config: RunConfig, tokenizer: Any) -> tuple[Any, Any, PreferenceStats]:
    """-> (train, validation or None, stats): the split is the SFT job's (seeded shuffle, data.validation_split)."""
    from datasets import Dataset

    path = config.resolved_data_path()
    pairs = read_pairs(path, config.data.max_examples)
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows, cut = cut_long_fields([as_trl_example(pair, chat, path) for pair in pairs], config.train.seq_len)
    train_rows, eval_rows = split_rows(config, rows)
    fmt = "preference pairs" + (" (chat template)" if chat else " (text)")
    stats = PreferenceStats(len(rows), len(train_rows), len(eval_rows), fmt, (cut,) if cut else ())
    return Dataset.from_list(train_rows), (Dataset.from_list(eval_rows) if eval_rows else None), stats


def dpo_config(config: RunConfig, arguments: dict[str, Any]) -> Any:
    """TRL's DPOConfig: the SFT job's TrainingArguments plus DPO's own settings."""
    from trl import DPOConfig

    technique = config.technique
    arguments = dict(arguments, train_sampling_strategy="random")  # group_by_length reads input_ids, absent here
    return DPOConfig(
        **arguments,
        beta=technique.dpo_beta,
        loss_type=[technique.dpo_loss],
        label_smoothing=LABEL_SMOOTHING.get(technique.dpo_loss, 0.0),
        max_length=config.train.seq_len,  # prompt + answer; longer pairs lose the answer's end
        truncation_mode="keep_start",
        padding_free=False,
        precompute_ref_log_probs=False,
        disable_dropout=technique.lora_dropout == 0.0,  # keeps a chosen lora_dropout
        dataset_num_proc=None,
    )


def preference_trainer(config: RunConfig, base: Any, lora: Any, tokenizer: Any, train_set: Any, eval_set: Any,
                       arguments: dict[str, Any], callbacks: list[Any], reporter: Any = None) -> Any:
    """The DPO trainer on `base` (loaded, not yet wrapped) with the adapter `lora`; ref_model None: TRL
    uses `base` with the adapter off, or with full tuning loads a frozen copy."""
    from trl import DPOTrainer

    return build_trl_trainer(DPOTrainer, config, base, lora, tokenizer, train_set, eval_set, callbacks,
                             ref_model=None, args=dpo_config(config, arguments))


build_datasets = build_preference_datasets
make_trainer = preference_trainer
