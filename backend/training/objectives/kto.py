"""KTO: answers labelled good or bad read and checked, and TRL's KTOTrainer built on any method.

The door of `technique.objective: kto` (backend.training.objectives.registry: build_datasets, make_trainer). Data:
unpaired examples, a prompt, one answer and a label saying whether the answer is desirable, in any
shape backend.core.data.preference_shapes reads (prompt/completion/label as text or chat messages,
LLaMA-Factory's messages or conversations with label or kto_tag); preference pairs are accepted too,
each unpaired into its chosen answer (desirable) and its rejected one (undesirable), and a note says so.
The training rows are shuffled with train.seed: TRL reads them in order (its KL estimate pairs each
prompt with the next example's answer within a batch), so a file sorted by label would give one-label batches.

As for DPO the reference is the base with the adapters off (TRL wraps the base with our peft config),
or with full tuning a frozen copy TRL loads; run folder, events, checkpoints and stop-and-save are the SFT job's.
"""

from __future__ import annotations

import random
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.training.tokenized import split_rows
from backend.training.objectives.dpo import PreferenceStats
from backend.core.data.long_fields import cut_long_fields
from backend.core.data.preference_shapes import as_trl_row, read_unpaired
from backend.training.objectives.trl_counting import build_trl_trainer


def kto_rows(config: RunConfig, chat: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """The data as TRL's unpaired rows {prompt, completion, label}, in file order; -> (rows, notes)."""
    path = config.resolved_data_path()
    examples, pairs = read_unpaired(path, config.data.max_examples)
    notes: list[str] = []
    if pairs:
        notes.append(f"{pairs} preference pairs unpaired for KTO: each chosen answer is a desirable example and "
                     f"each rejected one an undesirable example ({2 * pairs} examples)")
    good = sum(1 for e in examples if e["label"])
    if good in (0, len(examples)):
        raise bad_input(f"{path}: every example is labelled {'desirable' if good else 'undesirable'}; KTO learns "
                        "from both kinds", "add answers of the other label (true for good, false for bad)")
    return [as_trl_row(e, chat, path) for e in examples], notes


def build_datasets(config: RunConfig, tokenizer: Any) -> tuple[Any, Any, PreferenceStats]:
    """-> (train, validation or None, stats): split as every objective (data.validation_split), train rows shuffled."""
    from datasets import Dataset

    chat = bool(getattr(tokenizer, "chat_template", None))
    rows, notes = kto_rows(config, chat)
    rows, cut = cut_long_fields(rows, config.train.seq_len)
    notes += [cut] if cut else []
    train_rows, eval_rows = split_rows(config, rows)
    random.Random(config.train.seed).shuffle(train_rows)  # batches mix labels; TRL samples in order
    good = sum(1 for r in rows if r["label"])
    fmt = (f"labelled answers, {good} desirable / {len(rows) - good} undesirable"
           + (" (chat template)" if chat else " (text)"))
    stats = PreferenceStats(len(rows), len(train_rows), len(eval_rows), fmt, tuple(notes))
    return Dataset.from_list(train_rows), (Dataset.from_list(eval_rows) if eval_rows else None), stats


def kto_config(config: RunConfig, arguments: dict[str, Any]) -> Any:
    """TRL's KTOConfig: the SFT job's TrainingArguments plus KTO's own settings."""
    from trl import KTOConfig

    kto = config.kto
    # sequential: TRL's KL term pairs each example with its batch neighbours' answers (the rows are shuffled once)
    arguments = dict(arguments, train_sampling_strategy="sequential")
    return KTOConfig(
        **arguments,
        beta=kto.beta,
        desirable_weight=kto.desirable_weight,
        undesirable_weight=kto.undesirable_weight,
        loss_type="kto",
        max_length=config.train.seq_len,  # prompt + answer; longer examples lose the answer's end
        precompute_ref_log_probs=False,
        disable_dropout=config.technique.lora_dropout == 0.0,  # keeps a chosen lora_dropout
        dataset_num_proc=None,
    )


def make_trainer(config: RunConfig, base: Any, lora: Any, tokenizer: Any, train_set: Any, eval_set: Any,
                 arguments: dict[str, Any], callbacks: list[Any], reporter: Any = None) -> Any:
    """The KTO trainer on `base` (loaded, not yet wrapped) with the adapter `lora`; ref_model None: TRL
    uses `base` with the adapter off, or with full tuning loads a frozen copy."""
    from trl import KTOTrainer

    return build_trl_trainer(KTOTrainer, config, base, lora, tokenizer, train_set, eval_set, callbacks,
                             ref_model=None, args=kto_config(config, arguments))
