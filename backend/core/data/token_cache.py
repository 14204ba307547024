"""TokenCache: tokenize a dataset once, reuse it in every later run on the same data.

The key covers everything that changes the tokens: the tokenizer (its full serialisation), the
chat template, the data files' bytes, the format and the length rules. The cache lives under the
studio home (`cache/tokenized/<key>.json.gz`), shared by runs, and each run's worker.log says
whether it was reused. A corrupt or unreadable entry is ignored and rewritten, never trusted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.paths import studio_home

log = logging.getLogger(__name__)
VERSION = 2


def cache_key(config: RunConfig, tokenizer: Any, path: Path, fmt: str) -> str:
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update(backend.to_str().encode() if backend is not None else repr(tokenizer.get_vocab()).encode())
    digest.update(str(getattr(tokenizer, "chat_template", "")).encode())
    digest.update(repr((tokenizer.bos_token_id, tokenizer.eos_token_id)).encode())
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    rules = (VERSION, fmt, config.train.seq_len, config.data.truncate, config.data.max_examples)
    digest.update(repr(rules).encode())
    return digest.hexdigest()[:32]


class TokenCache:
    def __init__(self, key: str, root: Path | None = None):
        self.path = (root or studio_home() / "cache" / "tokenized") / f"{key}.json.gz"

    def load(self) -> tuple[list[dict[str, list[int]]], dict[str, Any]] | None:
        """The rows and the length facts saved with them (backend.core.data.lengths), or None."""
        try:
            with gzip.open(self.path, "rt", encoding="utf-8") as handle:
                data = json.load(handle)
            if not isinstance(data["lengths"], dict):
                raise ValueError("lengths is not an object")
            return data["rows"], data["lengths"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as exc:
            log.warning("ignoring unreadable token cache %s: %s", self.path, exc)
            return None

    def save(self, rows: list[dict[str, list[int]]], lengths: dict[str, Any]) -> None:
        """Written to a temporary name and renamed: a reader never sees half a cache."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            with gzip.open(tmp, "wt", encoding="utf-8") as handle:
                json.dump({"rows": rows, "lengths": lengths}, handle)
            os.replace(tmp, self.path)
        except OSError as exc:  # a full or read-only home only costs re-tokenizing next time
            log.warning("could not write the token cache %s: %s", self.path, exc)
