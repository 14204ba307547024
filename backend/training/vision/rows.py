"""Image rows -> token rows: the conversation through the chat template, its images through the processor.

Each `<image>` marker becomes the family's placeholder (`VisionFamily.prompt_image`, else the processor's
image token), which the processor expands into the image's tokens. The labels come from the text path's
own assistant mask (`tokenized.encode_conversation`, growing prefixes of the conversation), carried over
to the processor's expanded tokens by aligning the two token lists: tokens the processor added (the
image's) and the prompt stay -100, so only the assistant's text is ever a target. A row longer than
train.seq_len is truncated as the text path truncates, except that a cut through an image's tokens
drops the row (the model cannot take half an image) and is counted in a note.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset
from jinja2 import TemplateError

from backend.core.config.run_config import RunConfig
from backend.core.data.conversation import IMAGE_MARKER
from backend.core.data.examples import DatasetReader, Example
from backend.core.data.images import ImageRef, decode
from backend.core.data.lengths import LengthFacts
from backend.core.errors import bad_input
from backend.core.registries.vision_families import VisionFamily
from backend.training.tokenized import IGNORE, DataStats, cut_messages, encode_conversation, split_rows

log = logging.getLogger(__name__)


@dataclass
class ImageRows:
    """What the collator needs beside the token rows: each row's rendered text and its images (by `row`)."""

    texts: list[str] = field(default_factory=list)
    images: list[tuple[ImageRef, ...]] = field(default_factory=list)
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
    """Each row's conversation as it was encoded (`<image>` markers kept): evaluation asks its last answer."""
    image_rows: int = 0
    """Rows that hold at least one image (the rest are text-only rows of the same dataset)."""
    image_cut: int = 0
    """Rows dropped because train.seq_len fell inside an image's tokens."""


def placeholder(family: VisionFamily, processor: Any) -> str:
    """The text one image is written as before the processor expands it."""
    token = family.prompt_image or getattr(processor, "image_token", None) or family.image_token
    if not token:
        raise bad_input(f"{family.label}: the processor names no image token", "use the model's own processor files")
    return token


def rendered_text(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The whole row as the chat template writes it (raw text rows: bos + text + eos, as the text path)."""
    if messages and messages[0]["role"] == "text":
        return (tokenizer.bos_token or "") + messages[0]["content"] + (tokenizer.eos_token or "")
    return tokenizer.apply_chat_template(messages, tokenize=False)


def aligned_labels(text_ids: list[int], text_labels: list[int], ids: list[int], image_id: int | None) -> list[int]:
    """The text path's labels carried onto the processor's tokens: equal runs keep their labels, tokens
    the processor inserted (the image's) are -100, and an image token is never a target."""
    labels = [IGNORE] * len(ids)
    matcher = difflib.SequenceMatcher(None, text_ids, ids, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        labels[b:b + size] = text_labels[a:a + size]
    if image_id is not None:
        labels = [IGNORE if token == image_id else label for token, label in zip(ids, labels)]
    return labels


def encode_image_row(processor: Any, family: VisionFamily, image_id: int | None, messages: list[dict[str, Any]],
                     images: tuple[ImageRef, ...], processor_kwargs: dict[str, Any]) -> tuple[str, list[int], list[int]]:
    """-> (the rendered text, the processor's input_ids, labels on the assistant's text only)."""
    tokenizer = processor.tokenizer
    mark = placeholder(family, processor)
    messages = [{**m, "content": m["content"].replace(IMAGE_MARKER, mark)} for m in messages]
    text_ids, text_labels = encode_conversation(tokenizer, messages)
    text = rendered_text(tokenizer, messages)
    kwargs: dict[str, Any] = dict(text=[text], add_special_tokens=False, **processor_kwargs)
    if images:
        kwargs["images"] = [[decode(ref) for ref in images]]
    ids = [int(t) for t in processor(**kwargs)["input_ids"][0]]
    labels = aligned_labels(text_ids, text_labels, ids, image_id)
    wanted = sum(1 for x in text_labels if x != IGNORE)
    if sum(1 for x in labels if x != IGNORE) != wanted:
        raise ValueError("the processor's tokens do not line up with the chat template's at the assistant's text")
    return text, ids, labels


def build_image_datasets(config: RunConfig, processor: Any, family: VisionFamily, model_config: dict[str, Any],
                         processor_kwargs: dict[str, Any]) -> tuple[Dataset, Dataset | None, DataStats, ImageRows]:
    """The train and validation rows of a VLM run, with their texts and images for the collator."""
    path = config.resolved_data_path()
    reader = DatasetReader(path, config.data.format, config.data.skip_invalid, config.data.max_examples,
                           max_images=family.images_per_row)
    examples = reader.examples()
    if reader.needs_chat_template and not getattr(processor.tokenizer, "chat_template", None):
        raise bad_input(f"{config.model.path}: the tokenizer has no chat template, needed for {reader.format} data",
                        "use a model with a chat template, or text-format data")
    side = ImageRows()
    rows, lengths = _tokenize(config, processor, family, family.image_token_id(model_config), examples, reader,
                              processor_kwargs, side)
    train_rows, eval_rows = split_rows(config, rows)
    stats = DataStats(examples=len(rows), train_examples=len(train_rows), eval_examples=len(eval_rows),
                      truncated=lengths.truncated, format=reader.format,
                      trained_tokens=sum(sum(1 for x in r["labels"] if x != IGNORE) for r in train_rows))
    notes = reader.notes + lengths.notes(reader)
    if side.image_cut:
        notes.append(f"{side.image_cut} of {reader.total} rows dropped: train.seq_len {config.train.seq_len} "
                     "ends inside an image's tokens, and an image cannot be cut; raise train.seq_len or lower "
                     "vision.max_pixels")
    stats.skipped, stats.notes = reader.skipped, tuple(notes)
    for note in stats.notes:
        log.warning("%s", note)
    train = Dataset.from_list(train_rows)
    return train, Dataset.from_list(eval_rows) if eval_rows else None, stats, side


def _tokenize(config: RunConfig, processor: Any, family: VisionFamily, image_id: int | None, examples: list[Example],
              reader: DatasetReader, processor_kwargs: dict[str, Any], side: ImageRows) -> tuple[list[dict], LengthFacts]:
    seq_len = config.train.seq_len
    lengths = LengthFacts(seq_len)
    rows: list[dict[str, Any]] = []
    for example in examples:
        messages, cut = cut_messages(example.messages, lengths.limit)
        try:
            text, ids, labels = encode_image_row(processor, family, image_id, messages, example.images,
                                                 processor_kwargs)
        except (ValueError, TemplateError) as exc:
            raise bad_input(f"{reader.where(example.index)}: {exc}",
                            "fix the example, or pick a model whose chat template takes it") from None
        image_at = [i for i, token in enumerate(ids) if token == image_id]
        if image_at and image_at[-1] >= seq_len:  # the cut would fall inside (or before) an image
            side.image_cut += 1
            continue
        prompt = next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
        if not lengths.see(example.index, len(ids), prompt, cut) or (len(ids) > seq_len and not config.data.truncate):
            continue
        rows.append({"input_ids": ids[:seq_len], "labels": labels[:seq_len], "row": len(side.texts),
                     "image_tokens": len(image_at)})
        side.texts.append(text)
        side.images.append(example.images)
        side.messages.append(messages)
        side.image_rows += bool(example.images)
    if lengths.longer and not config.data.truncate:
        raise lengths.refusal(reader)
    if not rows:
        if lengths.dropped or side.image_cut:
            raise bad_input(f"{reader.path}: no row fits train.seq_len {seq_len} with its images",
                            "raise train.seq_len or lower vision.max_pixels")
        raise bad_input(f"{reader.path}: no example has tokens to train on", "check the format and train.seq_len")
    return rows, lengths
