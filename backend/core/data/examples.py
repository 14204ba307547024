"""DatasetReader: a dataset path read, converted and checked the way training uses it.

Each file gets its layout from its LLaMA-Factory dataset_info.json entry (when data.format is auto),
else from data.format, else detected from its first record. Examples that cannot be trained on (a
null or empty prompt, answer or turn) are counted by problem: the dataset is refused in one line
with the count and the first line, or, with data.skip_invalid, they are left out and `notes` says
how many. Torch-free: the studio's Data page reads through it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

from backend.core.errors import bad_input
from backend.core.data.conversation import InvalidExample, Message, convert
from backend.core.data.layouts import BUILTIN, Layout, detect_format, entry_layout
from backend.core.data.record_files import Part, read_parts

READER_VERSION = 4
"""Goes into the token cache key: bump it when the same record converts to different messages."""
SHOWN_PROBLEMS = 3


class Example(NamedTuple):
    index: int
    """Position in the dataset, counted over every file of a folder from 0."""
    messages: list[Message]


class DatasetReader:
    """Files and layouts of one data.path; `examples()` converts and checks every record."""

    def __init__(self, path: Path, fmt: str = "auto", skip_invalid: bool = False, limit: int | None = None):
        if fmt != "auto" and fmt not in BUILTIN:
            raise bad_input(f"unknown data.format {fmt!r}", f"use auto or one of {', '.join(BUILTIN)}")
        self.path = path
        self.skip_invalid = skip_invalid
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
        if fmt == "auto":
            return entry or BUILTIN[detect_format(part.rows, part.path)]
        return BUILTIN[fmt]

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

    def _find(self, index: int) -> tuple[Part, int]:
        for part in self.parts:
            if index < len(part.rows):
                return part, index
            index -= len(part.rows)
        raise IndexError(index)

    def examples(self, keep: Callable[[int], bool] | None = None) -> list[Example]:
        """Every record converted and checked; returns those `keep` wants (all when None).
        Raises the one-line refusal when some are invalid and data.skip_invalid is off."""
        problems: dict[str, list[int]] = {}  # problem -> [count, first index]
        kept: list[Example] = []
        index = 0
        for part, layout in zip(self.parts, self.layouts):
            if index >= self.total:
                break
            for record in part.rows:
                if index >= self.total:
                    break
                try:
                    messages = convert(record, layout)
                except InvalidExample as exc:
                    problems.setdefault(exc.problem, [0, index])[0] += 1
                else:
                    if keep is None or keep(index):
                        kept.append(Example(index, messages))
                index += 1
        self.skipped = sum(count for count, _ in problems.values())
        self.notes = list(self._read_notes)
        if not problems:
            return kept
        listed = list(problems.items())[:SHOWN_PROBLEMS]
        more = (f"; {len(problems) - SHOWN_PROBLEMS} more kinds of problem" if len(problems) > SHOWN_PROBLEMS else "")
        if self.skipped == self.total or not self.skip_invalid:
            said = "; ".join(f"{count} of {self.total} examples {_have(count)} {problem} (first: {self.short(first)})"
                             for problem, (count, first) in listed) + more
            if self.skipped == self.total:
                raise bad_input(f"{self.path}: no example can be trained on: {said}",
                                "check data.format and the field names")
            raise bad_input(f"{self.path}: {said}; fix them or set data.skip_invalid: true")
        said = "; ".join(f"{count} {_have(count)} {problem} (first: {self.short(first)})"
                         for problem, (count, first) in listed)
        self.notes.append(f"{self.path}: skipped {self.skipped} of {self.total} examples (data.skip_invalid): {said}{more}")
        return kept


def _have(count: int) -> str:
    return "has" if count == 1 else "have"
