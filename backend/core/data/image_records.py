"""A row with images -> its conversation, with an IMAGE_MARKER where each image sits, and its images.

The shapes read (each beside the text shapes of backend.core.data.layouts):
- LLaMA-Factory's: `messages` (or ShareGPT `conversations`) whose text holds `<image>` markers, and an
  `images` list of paths; its dataset_info.json entries with an `images` column;
- OpenAI content parts: {"type": "image_url", "image_url": {"url": ...}} (a path, a file:// URL or a
  data:image/...;base64, URI) and {"type": "image", "image": PATH}; a bare {"type": "image"} (TRL's
  placeholder) takes the next image of the `images` column;
- a table (Parquet, Arrow, save_to_disk) with an Image column, or a CSV/JSONL with a path column,
  named `images` (a list) or `image` (one), beside alpaca or text fields.
Paths resolve relative to the data file. A LLaMA-Factory or OpenAI conversation must hold one marker
per image, as LLaMA-Factory's mm_plugin requires; alpaca and text rows, whose fields have no such
convention, may hold none, and then their images lead the first user turn. Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from backend.core.data.conversation import IMAGE_MARKER, InvalidExample, Message, convert
from backend.core.data.images import ImageRef, decode, probe, resolve
from backend.core.data.layouts import Layout

IMAGE_COLUMNS = ("images", "image")
"""Fields detected as a row's images when no dataset_info.json entry names one."""


def with_images(layout: Layout, first: dict[str, Any]) -> Layout:
    """The layout, reading the images column its first record holds (when no entry named one)."""
    if layout.images:
        return layout
    column = next((name for name in IMAGE_COLUMNS if name in first), None)
    return replace(layout, images=column) if column else layout


def convert_row(record: dict[str, Any], layout: Layout, base: Path, max_images: int | None = None,
                check_pixels: bool = True) -> tuple[list[Message], tuple[ImageRef, ...]]:
    """One record -> (messages, its images probed). max_images: what the model takes a row (None: no
    limit known; 0: a text-only model). check_pixels: decode each image too (a truncated file is
    found only so). Raises InvalidExample naming the problem, the image and the fix."""
    if max_images == 0:
        messages = convert(record, layout)  # an image content part is refused there
        if layout.images and _column(record, layout.images):
            raise InvalidExample(f"{layout.images} (the studio trains on text only with this model)",
                                 fix="pick a vision-language model, or leave the images out")
        return messages, ()
    sources: list[Any] = []
    messages = convert(record, layout, sources)
    if not sources and not layout.images:
        return messages, ()
    column = _column(record, layout.images) if layout.images else []
    wanted = [source for source in sources if source is not None] + column
    markers = sum(message["content"].count(IMAGE_MARKER) for message in messages)
    if markers == 0 and wanted and layout.kind != "sharegpt":
        messages = _lead(messages, len(wanted))
        markers = len(wanted)
    if markers != len(wanted):
        fewer = markers < len(wanted)
        raise InvalidExample(f"{'fewer' if fewer else 'more'} {IMAGE_MARKER} markers than images",
                             detail=f"{markers} {IMAGE_MARKER} for {len(wanted)} "
                                    f"{'image' if len(wanted) == 1 else 'images'}",
                             fix=f"put one {IMAGE_MARKER} in the text where each image goes, and list one image "
                                 "per marker")
    if max_images is not None and len(wanted) > max_images:
        takes = f"{max_images} image" + ("" if max_images == 1 else "s")
        raise InvalidExample(f"more images than the model takes ({takes} a row)", detail=f"{len(wanted)} images",
                             fix=f"keep {takes} a row, or pick a model that takes more")
    images = tuple(probe(resolve(source, base)) for source in wanted)
    if check_pixels:
        for image in images:
            decode(image)
    return messages, images


def _column(record: dict[str, Any], column: str) -> list[Any]:
    """The images field as a list: a list, one path or Image cell, JSON text (a CSV cell), or none."""
    value = record.get(column)
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise InvalidExample(f"an {column} field that is not a JSON list", detail=value[:60],
                                 fix='write it as ["a.jpg", "b.jpg"]') from None
    if isinstance(value, (str, dict)):
        return [value]
    if isinstance(value, Sequence):
        return list(value)
    raise InvalidExample(f"an {column} field that is not a list of images", detail=type(value).__name__,
                         fix="list the image paths")


def _lead(messages: list[Message], count: int) -> list[Message]:
    """The images before the first user turn's text (or the text's, for raw text rows)."""
    out, placed = [], False
    for message in messages:
        if not placed and message["role"] in ("user", "text"):
            message = {**message, "content": IMAGE_MARKER * count + message["content"]}
            placed = True
        out.append(message)
    return out
