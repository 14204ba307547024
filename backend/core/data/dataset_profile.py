"""DatasetProfile: a dataset file read the way the worker reads it, plus approximate token lengths.

The records, the format detection, the conversion to conversations and the checks are the worker's
own (backend.core.data.examples, torch-free), so the preview shows what training will see. Token counts
use the model's tokenizer.json through the `tokenizers` package (Rust, no torch); the chat template
is not applied, so each message is counted as "role: content" and the figure is approximate (a
template adds a few tokens per message). Without a tokenizer.json, words x 1.3 stands in. A text longer
than training could use (MAX_CHARS_PER_TOKEN characters a token of seq_len) is measured on that much, as
training tokenizes it: a 50 MB answer costs no minutes and gigabytes, and its length is a lower bound.
Rows with images add the tokens the model spends on each (a callable the model's family gives,
image_tokens(width, height)); without it the lengths are the text's and `image_counts` says how many
images each row holds. Every image's header is checked (missing, unreadable, too large); only the
shown rows' pixels are decoded (11 ms a 640x480 JPEG on a shared CPU: 5,000 measured rows would hold
the page a minute), so a truncated image further down is found when training reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Sequence

from backend.core.errors import JobError
from backend.core.paths import resolve_resource
from backend.core.data.conversation import IMAGE_MARKER
from backend.core.data.examples import DatasetReader
from backend.core.data.images import ImageRef
from backend.core.data.lengths import MAX_CHARS_PER_TOKEN

PREVIEW_COUNT = 5
MAX_MEASURED = 5000
"""Token lengths are measured on at most this many examples (evenly spread) to stay quick."""
WORDS_TO_TOKENS = 1.3
"""Rough tokens per whitespace word of English text, used only when no tokenizer is found."""
MAX_TEXT_CHARS = 1_000_000
"""Without a seq_len, texts are measured on at most this many characters (a lower bound past it)."""
ImageTokens = Callable[[int, int], "int | None"]
"""A model family's tokens for one image of (width, height); None when the model is not known."""
TURN_END_TOKENS = 8
"""Allowance per assistant turn for what the chat template adds to the trained tokens (an end of
turn and a newline: 1-2 tokens in Llama 3, Qwen, Gemma and the bundled template; 8 to be safe)."""


@lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer  # Rust tokenizers: no torch, no transformers

    return Tokenizer.from_file(path)


@dataclass(frozen=True)
class DatasetProfile:
    """Format, size, a preview and token lengths of one dataset file; `problem` when unreadable."""

    path: str
    format: str = ""
    count: int = 0
    preview: tuple[tuple[dict[str, str], ...], ...] = ()
    lengths: tuple[int, ...] = ()
    measured: int = 0
    tokenizer: str = ""
    """Where token counts came from: a tokenizer.json path, or "" for the word-count estimate."""
    targets: tuple[int, ...] = ()
    """Per measured example, the tokens the loss is taken on: the answers plus TURN_END_TOKENS per
    assistant turn (every token of raw text)."""
    problem: str = ""
    hint: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    indices: tuple[int, ...] = ()
    """Per measured example, its record's index in the data (data.max_examples keeps those below it)."""
    text_lengths: tuple[int, ...] = ()
    """Per measured example, its text's tokens; `lengths` adds the image tokens when they are known."""
    image_counts: tuple[int, ...] = ()
    """Per measured example, how many images it holds (empty for text-only data)."""
    image_tokens_known: bool = False
    """Whether `lengths` holds the image tokens (a model's image_tokens callable gave them)."""
    preview_images: tuple[tuple[ImageRef, ...], ...] = ()
    """Per preview example, its images (for thumbnails)."""
    preview_tokens: tuple[tuple[int, int | None], ...] = ()
    """Per preview example, (text tokens, image tokens or None when the model is not known)."""

    @classmethod
    def read(cls, data_path: str, model_path: str = "", fmt: str = "auto",
             limit: int | None = MAX_MEASURED, skip_invalid: bool = False,
             seq_len: int | None = None, max_images: int | None = None,
             image_tokens: ImageTokens | None = None) -> "DatasetProfile":
        """Never raises: a file the worker would refuse comes back with its sentence in `problem`.
        limit: measure at most this many examples, evenly spread (None: all of them).
        skip_invalid: as data.skip_invalid (invalid examples are left out and counted in `notes`).
        seq_len: train.seq_len; each text is measured on its first MAX_CHARS_PER_TOKEN x seq_len characters
        (MAX_TEXT_CHARS without it).
        max_images: the images the model takes a row (None: no limit known; 0: a text-only model).
        image_tokens: the model's tokens per image; None shows the text tokens and the image counts."""
        if not data_path:
            return cls(data_path, problem="Choose a dataset file.")
        path = resolve_resource(data_path)
        try:
            reader = DatasetReader(path, fmt, skip_invalid, max_images=max_images,
                                   check_pixels=lambda i: i < PREVIEW_COUNT)
            limit = limit or max(1, reader.total)
            stride = max(1, reader.total // limit)
            # Every record is converted and checked (as training does); only these are kept.
            examples = reader.examples(keep=lambda i: i < PREVIEW_COUNT or i % stride == 0)
        except JobError as exc:
            return cls(data_path, problem=exc.message, hint=exc.hint)
        except OSError as exc:
            return cls(data_path, problem=f"{path}: {exc.strerror or exc}")
        shown = [e for e in examples if e.index < PREVIEW_COUNT]
        measured = [e for e in examples if e.index % stride == 0][:limit]
        sample = [e.messages for e in measured] + [e.messages for e in shown]
        texts = ["\n".join(f"{m['role']}: {m['content']}" if m["role"] != "text" else m["content"] for m in messages)
                 for messages in sample]
        pictured = [bool(e.images) for e in measured + shown]  # their markers become image tokens, not text
        texts = [text.replace(IMAGE_MARKER, "") if has else text for text, has in zip(texts, pictured)]
        answers = [[m["content"] for m in messages if m["role"] in ("assistant", "text")] for messages in sample]
        cap = seq_len * MAX_CHARS_PER_TOKEN if seq_len else MAX_TEXT_CHARS
        cut = sum(len(text) > cap for text in texts[:len(measured)])
        lengths, source = _token_lengths([text[:cap] for text in texts], model_path)
        lengths, shown_lengths, answers = lengths[:len(measured)], lengths[len(measured):], answers[:len(measured)]
        flat, _ = _token_lengths([a[:cap] for turns in answers for a in turns], model_path)
        targets, at = [], 0
        for turns in answers:
            targets.append(sum(flat[at:at + len(turns)]) + TURN_END_TOKENS * len(turns))
            at += len(turns)
        notes = list(reader.notes)
        if cut:
            notes.append(f"{path}: {cut} {'example is' if cut == 1 else 'examples are'} over {cap:,} characters, "
                         f"measured on {'its' if cut == 1 else 'their'} first {cap:,}: the lengths shown for "
                         f"{'it are lower bounds' if cut == 1 else 'them are lower bounds'}")
        pictures = [_image_tokens(e.images, image_tokens) for e in measured]
        known = bool(image_tokens) and all(n is not None for n in pictures)
        totals = [n + (pictures[i] or 0) for i, n in enumerate(lengths)] if known else lengths
        has_images = any(e.images for e in examples)
        return cls(data_path, reader.format, reader.total - reader.skipped, tuple(tuple(e.messages) for e in shown),
                   tuple(totals), len(measured), source, targets=tuple(targets), notes=tuple(notes),
                   indices=tuple(e.index for e in measured), text_lengths=tuple(lengths),
                   image_counts=tuple(len(e.images) for e in measured) if has_images else (),
                   image_tokens_known=known and has_images,
                   preview_images=tuple(e.images for e in shown) if has_images else (),
                   preview_tokens=tuple((n, _image_tokens(e.images, image_tokens)) for n, e in zip(shown_lengths, shown)))

    def within(self, max_examples: int | None) -> "DatasetProfile":
        """The measured examples among the first `max_examples` records (data.max_examples: what training
        reads); the whole profile when None."""
        if not max_examples or not self.indices:
            return self
        keep = [n for n, index in enumerate(self.indices) if index < max_examples]
        def pick(values: tuple) -> tuple:
            return tuple(values[n] for n in keep if n < len(values))

        return replace(self, lengths=pick(self.lengths), targets=pick(self.targets), indices=pick(self.indices),
                       text_lengths=pick(self.text_lengths), image_counts=pick(self.image_counts), measured=len(keep))

    def longest_answer(self) -> int | None:
        """The most loss tokens one example holds, for the memory estimate; None unless every example
        was measured with the model's tokenizer (a sample could miss the longest, a word count guesses)."""
        if not self.targets or not self.tokenizer or self.measured != self.count:
            return None
        return max(self.targets)

    def most_images(self) -> int | None:
        """The most images one row holds, for a VLM's memory estimate: 0 for text-only data; None unless every
        row was read (a sample could miss the row with the most)."""
        if self.problem or self.measured != self.count:
            return None
        return max(self.image_counts) if self.image_counts else 0

    def truncated_share(self, seq_len: int) -> float:
        """Share of the measured examples longer than seq_len tokens."""
        if not self.lengths:
            return 0.0
        return sum(1 for n in self.lengths if n > seq_len) / len(self.lengths)


def _image_tokens(images: Sequence[ImageRef], count: ImageTokens | None) -> int | None:
    """The tokens a row's images take (0 without images); None when the model does not say."""
    if not images:
        return 0
    if count is None:
        return None
    each = [count(image.width, image.height) for image in images]
    return None if any(n is None for n in each) else sum(each)


def _token_lengths(texts: list[str], model_path: str) -> tuple[list[int], str]:
    if model_path:
        tokenizer_file = resolve_resource(model_path) / "tokenizer.json"
        if tokenizer_file.is_file():
            try:
                tokenizer = _load_tokenizer(str(tokenizer_file))
                return [len(e.ids) for e in tokenizer.encode_batch(texts)], str(tokenizer_file)
            except Exception:  # a tokenizer.json this version of `tokenizers` cannot read
                pass
    return [max(1, round(len(t.split()) * WORDS_TO_TOKENS)) for t in texts], ""
