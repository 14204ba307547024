"""Tokenized training data: chat template, loss masks, truncation and the train/validation split.

Only the assistant's tokens carry labels: the prompt is masked with -100, so the loss (and the
tokens/s we report) count what the model is actually taught. The mask comes from rendering growing
prefixes of the conversation through the model's own chat template, which works for any template
whose render of messages[:k] is a prefix of the render of the whole.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from jinja2 import TemplateError

from backend.core.config.run_config import RunConfig
from backend.core.config.schedule import held_out
from backend.core.errors import bad_input
from backend.core.data.examples import DatasetReader, Example
from backend.core.data.lengths import LengthFacts
from backend.core.data.records import Message
from backend.core.data.token_cache import TokenCache, cache_key

log = logging.getLogger(__name__)
IGNORE = -100


@dataclass
class DataStats:
    examples: int
    train_examples: int
    eval_examples: int
    truncated: int
    """Examples cut to train.seq_len that still hold answer tokens (the dropped ones are in `notes`)."""
    format: str
    trained_tokens: int
    from_cache: bool = False
    skipped: int = 0
    """Invalid examples left out (data.skip_invalid)."""
    notes: tuple[str, ...] = ()
    """Sentences the person should see: how an odd file was read, what was skipped or dropped and why."""


def _render(tokenizer: Any, messages: list[Message], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def encode_conversation(tokenizer: Any, messages: list[Message]) -> tuple[list[int], list[int]]:
    """-> (input_ids, labels) with labels only on assistant turns (and on raw text)."""
    if messages and messages[0]["role"] == "text":
        ids = tokenizer(messages[0]["content"], add_special_tokens=False)["input_ids"]
        ids = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + ids
        ids.append(tokenizer.eos_token_id)
        return ids, list(ids)
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant turn to learn from")
    segments: list[tuple[str, bool]] = []
    done = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:k], generation_prompt=True)
        full = _render(tokenizer, messages[: k + 1])
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise ValueError("the chat template is not prefix-stable; cannot mask prompts")
        segments += [(prompt[len(done):], False), (full[len(prompt):], True)]
        done = full
    ids: list[int] = []
    labels: list[int] = []
    for text, trained in segments:
        if not text:
            continue
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [IGNORE] * len(piece)
    return ids, labels


def cut_messages(messages: list[Message], limit: int) -> tuple[list[Message], int]:
    """Each message's content cut to `limit` characters, so a many-megabyte answer is not tokenized whole
    only for all but seq_len of its tokens to be thrown away. -> (messages, characters of the longest
    message that was cut, or 0 when none was)."""
    longest = max((len(m["content"]) for m in messages), default=0)
    if longest <= limit:
        return messages, 0
    return [{**m, "content": m["content"][:limit]} for m in messages], longest


def build_datasets(config: RunConfig, tokenizer: Any) -> tuple[Dataset, Dataset | None, DataStats]:
    path: Path = config.resolved_data_path()
    reader = DatasetReader(path, config.data.format, config.data.skip_invalid, config.data.max_examples)
    examples = reader.examples()  # before the cache: a file with invalid examples is refused every time
    fmt = reader.format
    if reader.needs_chat_template and not getattr(tokenizer, "chat_template", None):
        raise bad_input(
            f"{config.model.path}: the tokenizer has no chat template, needed for {fmt} data",
            "use a model with a chat template, or text-format data",
        )
    seq_len = config.train.seq_len
    cache = TokenCache(cache_key(config, tokenizer, path, f"{fmt} {reader.cache_tag()}"))
    cached = cache.load()
    lengths = LengthFacts.from_json(cached[1]) if cached is not None else None
    if cached is not None and lengths is not None:
        rows = cached[0]
        log.info("tokenized examples reused from %s", cache.path)
    else:
        cached = None
        rows, lengths = _tokenize(config, tokenizer, examples, reader)
        cache.save(rows, lengths.to_json())
    if lengths.truncated:
        log.warning("%d of %d examples were truncated to %d tokens", lengths.truncated, len(rows), seq_len)
    train, evaluation, stats = _split(config, rows, lengths.truncated, fmt, cached is not None)
    stats.skipped, stats.notes = reader.skipped, tuple(reader.notes + lengths.notes(reader))
    for note in stats.notes:
        log.warning("%s", note)
    return train, evaluation, stats


def _tokenize(config: RunConfig, tokenizer: Any, examples: list[Example],
              reader: DatasetReader) -> tuple[list[dict[str, list[int]]], LengthFacts]:
    seq_len = config.train.seq_len
    rows: list[dict[str, list[int]]] = []
    lengths = LengthFacts(seq_len)
    for example in examples:
        messages, cut = cut_messages(example.messages, lengths.limit)
        try:
            ids, labels = encode_conversation(tokenizer, messages)
        except (ValueError, TemplateError) as exc:  # the chat template's own refusal (a role it has no place for)
            raise bad_input(f"{reader.where(example.index)}: {exc}",
                            "fix the example, or pick a model whose chat template takes it") from None
        prompt = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
        if not lengths.see(example.index, len(ids), prompt, cut) or (len(ids) > seq_len and not config.data.truncate):
            continue  # dropped (its prompt alone fills seq_len), or counted for the refusal below
        rows.append({"input_ids": ids[:seq_len], "labels": labels[:seq_len]})
    if lengths.longer and not config.data.truncate:
        raise lengths.refusal(reader)
    if not rows:
        if lengths.dropped:
            raise lengths.nothing_left(reader)
        raise bad_input(f"{reader.path}: no example has tokens to train on", "check the format and train.seq_len")
    return rows, lengths


def split_rows(config: RunConfig, rows: list[Any]) -> tuple[list[Any], list[Any]]:
    """(train, validation) rows: a seeded shuffle picks data.validation_split of them (at least one from
    four rows up); the training rows keep the file's order. Every objective splits the same way."""
    order = list(range(len(rows)))
    random.Random(config.train.seed).shuffle(order)
    n_eval = held_out(len(rows), config.data.validation_split)
    return [rows[i] for i in sorted(order[n_eval:])], [rows[i] for i in order[:n_eval]]


def _split(config: RunConfig, rows: list[dict[str, list[int]]], truncated: int, fmt: str,
           from_cache: bool) -> tuple[Dataset, Dataset | None, DataStats]:
    train_rows, eval_rows = split_rows(config, rows)
    stats = DataStats(
        examples=len(rows),
        train_examples=len(train_rows),
        eval_examples=len(eval_rows),
        truncated=truncated,
        format=fmt,
        trained_tokens=sum(sum(1 for x in r["labels"] if x != IGNORE) for r in train_rows),
        from_cache=from_cache,
    )
    train = Dataset.from_list(train_rows)
    evaluation = Dataset.from_list(eval_rows) if eval_rows else None
    return train, evaluation, stats


class PadCollator:
    """Pads to the longest example in the batch (not to seq_len): no compute spent on empty rows."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(features), width), dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            ids[row, :n] = torch.tensor(feature["input_ids"])
            labels[row, :n] = torch.tensor(feature["labels"])
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class PackingCollator:
    """Padding-free packing: a batch becomes one row, with position ids restarting at each example.

    The example boundaries also go in as transformers' varlen arguments (`cu_seq_lens_q/k`,
    `max_length_q/k`): FlashAttention-2 on CUDA and the studio's `sdpa_packed` elsewhere attend
    within each example only; eager attention reads the restarting position ids instead (a
    block-diagonal mask). Either way no example attends to another and not one pad token is computed.
    """

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        bounds = [0]
        for feature in features:
            n = len(feature["input_ids"])
            ids += feature["input_ids"]
            # The first token of each example must not be predicted from the previous example.
            labels += [IGNORE] + list(feature["labels"][1:])
            positions += list(range(n))
            bounds.append(bounds[-1] + n)
        cu_seq_lens = torch.tensor(bounds, dtype=torch.int32)
        longest = max((b - a for a, b in zip(bounds, bounds[1:])), default=0)
        return {
            "input_ids": torch.tensor([ids], dtype=torch.long),
            "labels": torch.tensor([labels], dtype=torch.long),
            "position_ids": torch.tensor([positions], dtype=torch.long),
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens,
            "max_length_q": longest,
            "max_length_k": longest,
        }
