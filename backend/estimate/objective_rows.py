"""The longest row DPO, KTO or GRPO will really run with, read from the data as TRL builds it.

TRL pads each batch to its longest row, never to train.seq_len (backend/training/objectives: no
padding to max_length), so an estimate at seq_len-long rows counts the demo's 42-token pairs as 128
and over-states the step 1.3-1.6x. The rows are the trainers' own (preference_shapes, prompt_records,
as_trl_row), rendered through the model's chat template (chat_template_text, as TRL's
apply_chat_template) and tokenized with its tokenizer.json; torch-free, cached per file version.
As for SFT's longest answer (DatasetProfile), data of more than MAX_MEASURED records is not read
(a sample could miss the longest row): the estimate then counts seq_len-long rows, the worst case.

- DPO: the prompt with its longer answer (chosen and rejected run as rows of one batch).
- KTO: the longest prompt plus the longest completion: the bound of the training rows and of the KL
  batch's, where each prompt takes another row's completion.
- GRPO: the longest prompt with the generation prompt; the completion is generated, up to
  grpo.max_completion_length.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.data import preference_shapes
from backend.core.data.chat_template_text import template_renderer
from backend.core.data.dataset_profile import MAX_MEASURED
from backend.core.data.prompt_records import read_prompts
from backend.core.paths import resolve_resource


def longest_row(config: RunConfig) -> int | None:
    """The data's longest row for the objective's trainer, in tokens (see the module's list); None for
    SFT, or where the data, the template or the tokenizer cannot be read (the estimate then counts seq_len)."""
    objective = config.technique.objective
    if objective not in ("dpo", "kto", "grpo"):
        return None
    try:
        path = config.resolved_data_path()
        model = resolve_resource(config.model.path)
        stat = os.stat(path)
        return _measured(str(path), stat.st_mtime_ns, stat.st_size, str(model), objective, config.data.max_examples)
    except Exception:  # noqa: BLE001 - an unreadable file is the worker's to refuse, with its own sentence
        return None


@lru_cache(maxsize=8)
def _measured(path: str, _mtime: int, _size: int, model: str, objective: str, limit: int | None) -> int | None:
    """longest_row's figure for one version of the file (the mtime and size are the cache's key)."""
    from tokenizers import Tokenizer  # Rust tokenizers: no torch

    tokenizer_file = Path(model) / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    render = template_renderer(Path(model))
    cap = MAX_MEASURED + 1 if limit is None else min(limit, MAX_MEASURED + 1)
    if objective == "grpo":
        prompts = [[r["prompt"]] for r in read_prompts(Path(path), (), cap)]
        return max(_lengths(tokenizer, render, prompts, answer=False)) if len(prompts) <= MAX_MEASURED else None
    rows = (preference_shapes.read_pairs(Path(path), cap) if objective == "dpo"
            else preference_shapes.read_unpaired(Path(path), cap)[0])
    if len(rows) > MAX_MEASURED:
        return None
    rows = [preference_shapes.as_trl_row(r, render is not None, Path(path)) for r in rows]
    if objective == "dpo":
        whole = [[r["prompt"], r[name]] for r in rows for name in ("chosen", "rejected")]
        return max(_lengths(tokenizer, render, whole, answer=True))
    prompts = _lengths(tokenizer, render, [[r["prompt"]] for r in rows], answer=False)
    whole = _lengths(tokenizer, render, [[r["prompt"], r["completion"]] for r in rows], answer=True)
    return max(prompts) + max(w - p for w, p in zip(whole, prompts))


def _lengths(tokenizer: Any, render: Any, rows: list[list[Any]], *, answer: bool) -> list[int]:
    """Tokens of each row (its prompt, and its answer when `answer`): through the chat template as TRL
    renders it (the generation prompt after a prompt alone; no special tokens added to the rendering),
    or plain text joined as TRL joins it (prompt + answer, the tokenizer's special tokens added)."""
    if render is not None:
        texts = [render(_turns(row[0]) + (_turns(row[1], "assistant") if answer else []), not answer) for row in rows]
        return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [len(e.ids) for e in tokenizer.encode_batch(["".join(map(str, row)) for row in rows])]


def _turns(value: Any, role: str = "user") -> list[dict[str, Any]]:
    """A field as chat turns (as_trl_row makes text a turn already; a stray string becomes one)."""
    return value if isinstance(value, list) else [{"role": role, "content": str(value)}]
