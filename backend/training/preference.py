"""DPO: preference pairs read and checked, and TRL's DPOTrainer built on a LoRA or DoRA adapter.

The door of `technique.objective: dpo` (backend.training.objectives: build_datasets, make_trainer). Data:
records with the text fields prompt, chosen and rejected (JSONL, JSON, CSV, Parquet, ... as for SFT),
a malformed one refused with its line and the missing field. Where the tokenizer has a chat template
the pair goes to TRL as a conversation (the prompt a user turn, each answer an assistant turn), so the
tuned model is trained as it will be prompted in chat; without one, as plain text.

The reference model is the base with the adapters switched off: TRL wraps the base with our peft
LoraConfig itself (passing an already wrapped model would make it copy the adapter as a "ref"
adapter), so no second copy of the weights is loaded. Run folder, events, checkpoints and
stop-and-save are the SFT job's: DPOTrainer is a transformers Trainer and ReportingCallback watches it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config import RunConfig
from backend.errors import bad_input
from backend.training.data import split_rows
from backend.training.record_files import read_parts
from backend.training.trl_counting import counting_trainer

log = logging.getLogger(__name__)

PAIR_FIELDS = ("prompt", "chosen", "rejected")
LABEL_SMOOTHING = {"robust": 0.1, "exo_pair": 1e-3}
"""The smoothing the Robust DPO and EXO papers recommend; TRL refuses exo_pair without one."""


@dataclass
class PreferenceStats:
    examples: int
    train_examples: int
    eval_examples: int
    format: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def read_pairs(path: Path, limit: int | None = None) -> list[dict[str, str]]:
    """Every record as {prompt, chosen, rejected} text, in order; the first malformed one is refused
    in one line that names the file, the line and the field."""
    pairs: list[dict[str, str]] = []
    for part in read_parts(path):
        for index, record in enumerate(part.rows):
            if limit is not None and len(pairs) >= limit:
                return pairs
            where = f"{part.path} {part.locate(index)}"
            missing = [name for name in PAIR_FIELDS if name not in record]
            if missing:
                raise bad_input(
                    f"{where}: a preference pair needs the fields prompt, chosen and rejected; this record has "
                    f"no {' and no '.join(repr(m) for m in missing)} (its fields: {', '.join(sorted(map(str, record)))})",
                    "give every record the three text fields, or set technique.objective: sft for instruction data")
            for name in PAIR_FIELDS:
                value = record[name]
                if not isinstance(value, str):
                    shown = "null" if value is None else type(value).__name__
                    raise bad_input(f"{where}: the field {name!r} is {shown}, not text",
                                    "write prompt, chosen and rejected as strings")
                if not value.strip():
                    raise bad_input(f"{where}: the field {name!r} is empty", "fill it in or remove the record")
            if record["chosen"] == record["rejected"]:
                raise bad_input(f"{where}: 'chosen' and 'rejected' are the same answer: the pair teaches nothing",
                                "fix the pair or remove the record")
            pairs.append({name: record[name] for name in PAIR_FIELDS})
    if not pairs:
        raise bad_input(f"{path}: no preference pair to train on", "check data.path")
    return pairs


def as_trl_example(pair: dict[str, str], chat: bool) -> dict[str, Any]:
    """One pair as TRL reads it: conversational (rendered through the model's chat template) or text."""
    if not chat:
        return dict(pair)
    return {"prompt": [{"role": "user", "content": pair["prompt"]}],
            "chosen": [{"role": "assistant", "content": pair["chosen"]}],
            "rejected": [{"role": "assistant", "content": pair["rejected"]}]}


def build_preference_datasets(config: RunConfig, tokenizer: Any) -> tuple[Any, Any, PreferenceStats]:
    """-> (train, validation or None, stats): the split is the SFT job's (seeded shuffle, data.validation_split)."""
    from datasets import Dataset

    path = config.resolved_data_path()
    pairs = read_pairs(path, config.data.max_examples)
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows = [as_trl_example(pair, chat) for pair in pairs]
    train_rows, eval_rows = split_rows(config, rows)
    fmt = "preference pairs" + (" (chat template)" if chat else " (text)")
    stats = PreferenceStats(len(rows), len(train_rows), len(eval_rows), fmt)
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
    """The DPO trainer on `base` (loaded, not yet wrapped) with the adapter `lora`; ref_model None: the
    reference is `base` with the adapter off."""
    from trl import DPOTrainer

    from backend.training.loading import check_adapters

    try:
        trainer = counting_trainer(DPOTrainer)(
            model=base,
            ref_model=None,
            args=dpo_config(config, arguments),
            train_dataset=train_set,
            eval_dataset=eval_set,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        if "target modules" in first.lower() or "target_modules" in first:
            raise bad_input(f"technique.lora_targets: {first}", "use all-linear or names like q_proj,v_proj") from None
        raise
    check_adapters(trainer.model, config)
    return trainer


build_datasets = build_preference_datasets
make_trainer = preference_trainer
