"""ImagePrompter: a VLM run's conversation and its images -> the model's inputs, as training wrote them.

Chat and evaluation must ask a vision-language model the way it learned: each `<image>` marker becomes the
family's placeholder (training/vision/rows.placeholder), the conversation goes through the tokenizer's chat
template with the generation prompt, and the family's own processor expands the placeholders and lays out
the pixels (Qwen's patches and grid, Mllama's tiles and cross-attention mask, ...), the resolution cap of
`vision.max_pixels` applied as in training (training/vision/door.VisionRun). Images are checked by their
header and decoded as the data readers do (backend/core/data/images.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from backend.core.config.run_config import RunConfig
from backend.core.data.conversation import IMAGE_MARKER, InvalidExample
from backend.core.data.images import ImageRef, decode, probe, resolve
from backend.core.errors import bad_input
from backend.training.vision.door import VisionRun
from backend.training.vision.rows import placeholder

NO_IMAGES = "this model reads no images"
"""The refusal of an image sent to a text model (a test and the CLI read it)."""


def image_refs(paths: Sequence[str], base: Path | None = None) -> list[ImageRef]:
    """Image paths as a chat sends them -> checked ImageRefs (header read, bombs refused), one line each."""
    refs = []
    for path in paths:
        try:
            refs.append(probe(resolve(path, base or Path.cwd())))
        except InvalidExample as exc:
            raise bad_input(f"image {path}: {exc.problem}", exc.fix or "give a PNG or JPEG file") from None
    return refs


def with_markers(messages: list[dict[str, str]], images: int) -> list[dict[str, str]]:
    """The conversation with one `<image>` per image: markers the text already holds stay; with none, the
    images lead the last user message (as image_records._lead places a row's images)."""
    count = sum(m["content"].count(IMAGE_MARKER) for m in messages)
    if count == images:
        return messages
    if count:
        raise bad_input(f"the conversation has {count} {IMAGE_MARKER} markers for {images} images",
                        f"write one {IMAGE_MARKER} where each image goes, or none to put them before the message")
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    out = list(messages)
    out[last] = {**out[last], "content": IMAGE_MARKER * images + out[last]["content"]}
    return out


class ImagePrompter:
    """The processor of one VLM folder, turning conversations with images into generate()'s inputs."""

    def __init__(self, folder: Path, config: RunConfig):
        self.run = VisionRun.open(folder, config)
        self.family = self.run.family
        self.processor = self.run.processor
        self.tokenizer = self.processor.tokenizer

    def inputs(self, messages: list[dict[str, str]], images: Sequence[ImageRef]) -> dict[str, Any]:
        """The processor's tensors (input_ids, attention_mask, pixel tensors) for the model's answer to
        `messages`, whose `<image>` markers match `images` in order."""
        limit = self.family.images_per_row
        if limit is not None and len(images) > limit:
            raise bad_input(f"{self.family.label} reads at most {limit} image(s) per conversation, "
                            f"this one has {len(images)}", "start a new conversation for the next image")
        mark = placeholder(self.family, self.processor)
        messages = [{**m, "content": m["content"].replace(IMAGE_MARKER, mark)} for m in messages]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in messages)
        kwargs: dict[str, Any] = dict(text=[text], add_special_tokens=False, return_tensors="pt")
        if images:
            kwargs["images"] = [[decode(ref) for ref in images]]
        return dict(self.processor(**kwargs))
