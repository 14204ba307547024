"""DatasetReader: a dataset path read, converted and checked the way training uses it.

Each file gets its layout from its LLaMA-Factory dataset_info.json entry (when data.format is auto),
else from data.format, else detected from its first record. Examples that cannot be trained on (a
null or empty prompt, answer or turn; a missing, corrupt or oversized image, a marker count that
does not match the images) are counted by problem: the dataset is refused in one line with the count,
the first line and the fix, or, with data.skip_invalid, they are left out and `notes` says how many.
Rows with images convert through backend.core.data.image_records. Torch-free: the studio's Data page
reads through it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from backend.core.errors import bad_input
from backend.core.data.conversation import InvalidExample, Message
from backend.core.data.image_records import convert_row, with_images
from backend.core.data.images import ImageRef
from backend.core.data.layouts import BUILTIN, Layout, detect_format, entry_layout
from backend.core.data.record_files import Part, read_parts

READER_VERSION = 4
"""Goes into the token cache key: bump it when the same record converts to different messages."""
SHOWN_PROBLEMS = 3


class Example(NamedTuple):
    index: int
    """Position in the dataset, counted over every file of a folder from 0."""
    messages: list[Message]
    images: tuple[ImageRef, ...] = ()
    """The row's images, probed (size and mode), in the order of the IMAGE_MARKERs in `messages`."""


class DatasetReader:
    """Files and layouts of one data.path; `examples()` converts and checks every record."""

    def __init__(self, path: Path, fmt: str = "auto", skip_invalid: bool = False, limit: int | None = None,
                 max_images: int | None = 0, check_pixels: bool | Callable[[int], bool] = True):
        """max_images: the images a row may hold, from the model's family (0: a text-only model, whose
        training refuses image rows; None: no limit known, as the Data page reads before a model is
        known). check_pixels: decode the kept rows' images (a truncated file shows only then), or those of
        the rows (by index) it says yes to; off, images are checked by their headers (size, format, the
        bomb guard) alone."""
        if fmt != "auto" and fmt not in BUILTIN:
            raise bad_input(f"unknown data.format {fmt!r}", f"use auto or one of {', '.join(BUILTIN)}")
        self.path = path
        self.skip_invalid = skip_invalid
        self.max_images = max_images
        self.check_pixels = check_pixels
        self.parts: list[Part] = read_parts(path)
        folder = path if path.is_dir() and self.parts[0].path != path else None  # a folder of files
        self.layouts: list[Layout] = [self._layout(part, fmt, folder) for part in self.parts]
        size = sum(len(part.rows) for part in self.parts)
        self.total = min(size, limit) if limit else size
        """Records read: all of them, or the first data.max_examples."""
        self.skipped = 0
        self._read_notes = [note for part in self.parts for note in part.notes]
        self.notes: list[str] = list(self._read_notes)
        """Sentences for the person: how odd files were read, and (after examples()) what was skipped."""

    @staticmethod
    def _layout(part: Part, fmt: str, folder: Path | None) -> Layout:
        entry = entry_layout(part.path, folder)  # refuses preference data whatever data.format says
        if fmt == "auto" and entry:
            return entry
        layout = BUILTIN[detect_format(part.rows, part.path) if fmt == "auto" else fmt]
        return with_images(layout, part.rows[0])

    @property
    def format(self) -> str:
        return "+".join(dict.fromkeys(layout.label for layout in self.layouts))

    @property
    def needs_chat_template(self) -> bool:
        return any(layout.kind != "text" for layout in self.layouts)

    def cache_tag(self) -> str:
        """What besides the files' bytes decides the conversations (for the token cache key)."""
        return repr((READER_VERSION, self.layouts))

    def where(self, index: int) -> str:
        """Dataset index -> "path line 7" (or "row 7")."""
        part, local = self._find(index)
        return f"{part.path} {part.locate(local)}"

    def short(self, index: int) -> str:
        """Dataset index -> "line 7", with the file's name when data.path is a folder."""
        part, local = self._find(index)
        return part.locate(local) if part.path == self.path else f"{part.path.name} {part.locate(local)}"

    def _first(self, index: int, detail: str) -> str:
        return f"{self.short(index)}, {detail}" if detail else self.short(index)

    def _find(self, index: int) -> tuple[Part, int]:
        for part in self.parts:
            if index < len(part.rows):
                return part, index
            index -= len(part.rows)
        raise IndexError(index)

    def examples(self, keep: Callable[[int], bool] | None = None) -> list[Example]:
        """Every record converted and checked; returns those `keep` wants (all when None).
        Raises the one-line refusal when some are invalid and data.skip_invalid is off."""
        problems: dict[str, list] = {}  # problem -> [count, first index, its detail, its fix]
        kept: list[Example] = []
        index = 0
        for part, layout in zip(self.parts, self.layouts):
            if index >= self.total:
                break
            base = part.path if part.path.is_dir() else part.path.parent  # image paths are relative to it
            for record in part.rows:
                if index >= self.total:
                    break
                wanted = keep is None or keep(index)
                try:
                    pixels = self.check_pixels(index) if callable(self.check_pixels) else self.check_pixels
                    messages, images = convert_row(record, layout, base, self.max_images, pixels and wanted)
                except InvalidExample as exc:
                    problems.setdefault(exc.problem, [0, index, exc.detail, exc.fix])[0] += 1
                else:
                    if wanted:
                        kept.append(Example(index, messages, images))
                index += 1
        self.skipped = sum(found[0] for found in problems.values())
        self.notes = list(self._read_notes)
        if not problems:
            return kept
        listed = list(problems.items())[:SHOWN_PROBLEMS]
        more = (f"; {len(problems) - SHOWN_PROBLEMS} more kinds of problem" if len(problems) > SHOWN_PROBLEMS else "")
        fixes = "; ".join(dict.fromkeys(fix for _, (_, _, _, fix) in listed if fix))
        if self.skipped == self.total or not self.skip_invalid:
            said = "; ".join(f"{count} of {self.total} examples {_have(count)} {problem} "
                             f"(first: {self._first(first, detail)})"
                             for problem, (count, first, detail, _) in listed) + more
            if self.skipped == self.total:
                raise bad_input(f"{self.path}: no example can be trained on: {said}",
                                fixes or "check data.format and the field names")
            raise bad_input(f"{self.path}: {said}; fix them or set data.skip_invalid: true", fixes)
        said = "; ".join(f"{count} {_have(count)} {problem} (first: {self._first(first, detail)})"
                         for problem, (count, first, detail, _) in listed)
        self.notes.append(f"{self.path}: skipped {self.skipped} of {self.total} examples (data.skip_invalid): {said}{more}")
        return kept


def _have(count: int) -> str:
    return "has" if count == 1 else "have"
