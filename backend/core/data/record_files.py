"""Dataset files -> rows (dicts), each row able to say where it came from.

JSON, JSONL and .txt are read by backend.core.data.text_files, stdlib only, with errors that name the
file line. CSV (comma-separated, or semicolons or tabs said in a note), Parquet,
Arrow files and `datasets.save_to_disk` folders are read by the `datasets` library, imported only for
them (it costs a second or two and pulls in pandas, never torch): CSV and Parquet are converted in a
scratch folder under the studio home that is deleted at once (the rows stay in memory), Arrow and
save_to_disk folders are memory-mapped where they are. Nothing is written beside the data.

A folder that is not a save_to_disk folder is every dataset file in it (sorted by name; hidden
files, subfolders and dataset_info.json left out), each read, and later converted, on its own.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from backend.core.errors import bad_input
from backend.core.paths import studio_home
from backend.core.data.text_files import Part, decode, read_text_file

__all__ = ["NOT_RECORDS", "READABLE", "ArrowRows", "Part", "read_file", "read_parts"]

TEXT_SUFFIXES = (".jsonl", ".json", ".txt")
TABLE_SUFFIXES = (".csv", ".parquet", ".arrow")
READABLE = TEXT_SUFFIXES + TABLE_SUFFIXES
NOT_RECORDS = ("dataset_info.json", "state.json", "dataset_dict.json")
"""Metadata files of LLaMA-Factory and of `datasets`: never read as examples."""


def read_parts(path: Path) -> list[Part]:
    if not path.exists():
        raise bad_input(f"{path}: dataset file not found",
                        "pick an existing .jsonl, .json, .csv, .parquet or .txt file, or a dataset folder")
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return [_read_saved(path)]
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in READABLE
                       and not p.name.startswith(".") and p.name not in NOT_RECORDS)
        if not files:
            raise bad_input(f"{path}: the folder holds nothing readable "
                            f"(no {', '.join(READABLE)} file, and it is no save_to_disk folder)",
                            "point data.path at a dataset file, or put one in the folder")
        return [read_file(file) for file in files]
    return [read_file(path)]


def read_file(path: Path) -> Part:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".parquet":
        return _read_table(path, "Parquet", lambda datasets, scratch: datasets.Dataset.from_parquet(
            str(path), cache_dir=scratch, keep_in_memory=True))
    if suffix == ".arrow":
        return _read_table(path, "Arrow", lambda datasets, scratch: datasets.Dataset.from_file(str(path)))
    return read_text_file(path)


# --- CSV, Parquet, Arrow, save_to_disk (through `datasets`) ---------------------------------------

def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise bad_input("reading CSV, Parquet or Arrow data needs the `datasets` package",
                        "pip install datasets, or convert the data to JSONL") from None
    return datasets


@contextlib.contextmanager
def _quiet() -> Iterator[Any]:
    """`datasets` with its progress bars off (they would land in the studio's console)."""
    datasets = _datasets()
    bars = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    logger = logging.getLogger("datasets")  # it logs a failed read before raising: we say it once
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield datasets
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    """A folder for `datasets`' conversion cache under the studio home, removed afterwards."""
    root = studio_home() / "cache"
    root.mkdir(parents=True, exist_ok=True)
    with _quiet(), tempfile.TemporaryDirectory(prefix="reading-", dir=root) as folder:
        yield folder


def _read_table(path: Path, kind: str, load: Callable[[Any, str], Any]) -> Part:
    datasets = _datasets()
    try:
        with _scratch() as scratch:
            table = load(datasets, scratch)
    except Exception as exc:  # datasets wraps pyarrow's errors; the innermost one says what is wrong
        raise bad_input(f"{path}: not a readable {kind} file ({_cause(exc)})",
                        f"check that it is a {kind} file, or convert the data to JSONL") from None
    return _table_part(path, table)


def _read_csv(path: Path) -> Part:
    datasets = _datasets()
    with path.open("rb") as handle:
        head = handle.read(4096)
    if b"\x00" in head or head[:2] in (b"\xff\xfe", b"\xfe\xff"):
        kind = "UTF-16 text" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "a binary file"
        raise bad_input(f"{path}: looks like {kind}, not UTF-8 CSV text", "save the data as UTF-8 CSV")
    header, sep = _csv_header(path)
    # Every column as text, "" as "": pandas would read "007" as 7 and "None" or "NA" as a null.
    features = datasets.Features({name: datasets.Value("string") for name in header})
    try:
        with _scratch() as scratch:
            table = datasets.Dataset.from_csv(str(path), cache_dir=scratch, keep_in_memory=True, features=features,
                                              keep_default_na=False, encoding="utf-8-sig", sep=sep)
    except Exception as exc:
        if isinstance(_innermost(exc), UnicodeDecodeError):
            decode(path, path.read_bytes())  # raises with the line
        raise bad_input(f"{path}: not readable as CSV ({_cause(exc)})",
                        "check the quoting and that every row has the header's columns") from None
    lines = _LazyCsvLines(path, sep)
    notes = () if sep == "," else (f"{path}: the columns are separated by {sep!r}, not commas: read that way",)
    return _table_part(path, table, lambda i: f"line {lines[i]}", notes)


def _csv_header(path: Path) -> tuple[list[str], str]:
    """The header row, once it is known that a row follows it, and the separator: a comma, or the
    semicolon or tab of a header that is one column otherwise (Excel's CSV in many locales)."""
    header: list[str] | None = None
    sep = ","
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            first = handle.readline()
            if first.count(",") == 0:
                sep = next((c for c in (";", "\t") if c in first), ",")
            handle.seek(0)
            for row in csv.reader(handle, delimiter=sep):
                if row and header is not None:
                    break
                header = header or row or None
            else:
                raise bad_input(f"{path}: the dataset is empty", "add a header row and at least one example")
    except UnicodeDecodeError:
        decode(path, path.read_bytes())
    except csv.Error as exc:
        raise bad_input(f"{path}: not readable as CSV ({exc})") from None
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise bad_input(f"{path} line 1: the header names {', '.join(map(repr, repeated))} more than once",
                        "give every column its own name")
    return header, sep


class _LazyCsvLines:
    """The line each CSV row starts on (a quoted cell may span lines), scanned on first use."""

    def __init__(self, path: Path, sep: str = ","):
        self._path = path
        self._sep = sep
        self._starts: list[int] | None = None

    def __getitem__(self, index: int) -> int:
        if self._starts is None:
            starts, end = [], 0
            with self._path.open(encoding="utf-8-sig", newline="") as handle:
                reader = csv.reader(handle, delimiter=self._sep)
                for row in reader:
                    start, end = end + 1, reader.line_num
                    if row:  # pandas skips blank lines too
                        starts.append(start)
            self._starts = starts[1:]  # the header is not a row
        return self._starts[index]


def _read_saved(folder: Path) -> Part:
    datasets = _datasets()
    try:
        with _quiet():
            loaded = datasets.load_from_disk(str(folder))
    except Exception as exc:
        raise bad_input(f"{folder}: not a readable save_to_disk folder ({_cause(exc)})",
                        "save it again with Dataset.save_to_disk, or convert the data to JSONL") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if "train" not in loaded and len(splits) != 1:
            raise bad_input(f"{folder}: a DatasetDict with the splits {splits} and no 'train' split",
                            "save the split to train on by itself, or name it train")
        loaded = loaded["train" if "train" in loaded else splits[0]]
    return _table_part(folder, loaded)


def _table_part(path: Path, table: Any, locate: Callable[[int], str] | None = None,
                notes: tuple[str, ...] = ()) -> Part:
    if len(table) == 0:
        raise bad_input(f"{path}: the dataset is empty", "add at least one example")
    return Part(path, ArrowRows(_undecoded(table).with_format(None)), locate or (lambda i: f"row {i + 1}"), notes)


def _undecoded(table: Any) -> Any:
    """Image columns as their stored {"bytes", "path"} cells, not decoded pictures: the reader probes
    each header first (backend.core.data.images). Same Arrow data, other features: nothing is copied
    (Dataset.cast_column would rewrite a list-of-images column through a cache file)."""
    datasets = _datasets()

    def raw(feature: Any) -> Any:
        if isinstance(feature, datasets.Image):
            return datasets.Image(decode=False)
        if isinstance(feature, (datasets.List, datasets.Sequence)):
            return type(feature)(raw(feature.feature), length=feature.length)
        if isinstance(feature, dict):
            return {key: raw(value) for key, value in feature.items()}
        return feature

    features = datasets.Features({name: raw(feature) for name, feature in table.features.items()})
    if features == table.features:
        return table
    info = table.info.copy()
    info.features = features
    return datasets.Dataset(table.data, info=info, split=table.split, indices_table=table._indices)


class ArrowRows(Sequence[dict[str, Any]]):
    """A `datasets.Dataset` as a sequence of row dicts, decoded a batch at a time while iterated
    (one row at a time costs ~50 us; a batch of 1000 ~1.5 us a row)."""

    BATCH = 1000

    def __init__(self, table: Any, span: range | None = None):
        self._table = table
        self._span = span if span is not None else range(len(table))

    def __len__(self) -> int:
        return len(self._span)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return ArrowRows(self._table, self._span[key])
        return self._table[self._span[key]]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        span = self._span
        if span.step != 1:
            yield from (self._table[i] for i in span)
            return
        for start in range(span.start, span.stop, self.BATCH):
            batch = self._table[start:min(start + self.BATCH, span.stop)]
            names = list(batch)
            yield from (dict(zip(names, values)) for values in zip(*batch.values()))


def _innermost(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    return exc


def _cause(exc: BaseException) -> str:
    inner = _innermost(exc)
    text = " ".join(str(inner).split()) or type(inner).__name__
    return text[:200]
