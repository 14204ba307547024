"""A first look at DPO, KTO and GRPO data for the Data page: the records' fields, a few rows, one refusal.

Torch-free (the studio imports it). DPO and KTO rows go through the trainers' own reader,
preference_shapes (every shape it accepts, a LLaMA-Factory dataset_info.json included), so the page
shows what will train and refuses what the run would refuse, with the same line; GRPO rows (a
prompt and any other columns) go through the trainer's own check, prompt_records.check_prompt.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from backend.core.errors import JobError
from backend.core.paths import resolve_resource
from backend.core.data import preference_shapes
from backend.core.data.chat_template_text import Render, special_tokens, template_renderer
from backend.core.data.prompt_records import check_prompt
from backend.core.data.record_files import read_parts

FIELDS = {"dpo": ("prompt", "chosen", "rejected"), "kto": ("prompt", "completion", "label"), "grpo": ("prompt",)}
"""The fields each objective reads from every record."""
WHAT = {"dpo": "preference pairs", "kto": "labelled answers", "grpo": "prompts"}
PREVIEW_ROWS = 20
CHECKED_ROWS = 5000
"""Records whose fields are checked (all of a small file; the first ones of a large one)."""


@dataclass(frozen=True)
class ObjectiveRecords:
    """What the Data page shows for a non-SFT objective: columns, preview rows (text), a count, or a problem."""

    path: str
    objective: str
    columns: tuple[str, ...] = ()
    rows: tuple[dict[str, str], ...] = ()
    count: int = 0
    problem: str = ""
    hint: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    templated: bool = False
    """Whether the rows are shown through the model's chat template (as the model will read them)."""
    special: tuple[str, ...] = ()
    """The model's special tokens (with templated rows): the preview leaves them out of a cell's text."""

    @property
    def what(self) -> str:
        return WHAT.get(self.objective, "records")


def as_text(value: Any) -> str:
    """A field as a person reads it: text as is, a conversation as "role: content" lines, else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) and value[0].get("role") == "assistant":
        return str(value[0].get("content"))  # an answer: its text
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', '?')}: {m['content']}" for m in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _turns(value: Any) -> list[dict[str, Any]]:
    return value if isinstance(value, list) else [{"role": "user", "content": str(value)}]


def rendered(row: dict[str, Any], render: Render) -> dict[str, str]:
    """A row as the model will read it: the prompt through the chat template up to the assistant's
    turn, each answer as the text the template adds after it (what the loss is taken on)."""
    prompt = _turns(row["prompt"])
    head = render(prompt, True)
    out = {"prompt": head}
    for name in ("chosen", "rejected", "completion"):
        if name in row:
            answer = row[name] if isinstance(row[name], list) else [{"role": "assistant", "content": str(row[name])}]
            full = render(prompt + answer, False)
            out[name] = full[len(head):] if full.startswith(head) else full
    return out | {k: as_text(v) for k, v in row.items() if k not in out}


def _safely(row: dict[str, Any], render: Render | None, plain: dict[str, str]) -> dict[str, str]:
    """The row through the template, or as its fields where the template refuses it (training says why)."""
    if render is None:
        return plain
    try:
        return rendered(row, render)
    except Exception:  # noqa: BLE001 - a template's own error (raise_exception, a missing key) is not the preview's
        return plain


def read_objective_records(data_path: str, objective: str, needed: tuple[str, ...] = (),
                           limit: int = PREVIEW_ROWS, model_path: str | None = None) -> ObjectiveRecords:
    """Never raises: the first record missing a field (of FIELDS or `needed`, the columns the
    rewards read) comes back as `problem`, naming the file, the line and the field. With
    `model_path`, rows are shown through its chat template where it has one."""
    render, special = None, ()
    if model_path:
        try:
            render = template_renderer(resolve_resource(model_path))
            special = special_tokens(resolve_resource(model_path))
        except (OSError, ValueError):
            render = None
    if objective in ("dpo", "kto"):
        return _with_template(_preference_records(data_path, objective, limit, render), render, special)
    try:  # GRPO: prompts, checked by the trainer's own check
        parts = read_parts(resolve_resource(data_path))
    except JobError as exc:
        return ObjectiveRecords(data_path, objective, problem=exc.message, hint=exc.hint)
    except (OSError, ValueError) as exc:
        return ObjectiveRecords(data_path, objective, problem=f"{data_path}: {exc}")
    rows: list[dict[str, str]] = []
    columns: dict[str, None] = dict.fromkeys(FIELDS.get(objective, ()))
    count = 0
    notes = tuple(note for part in parts for note in part.notes)
    for part in parts:
        for index, record in enumerate(part.rows):
            count += 1
            if count > CHECKED_ROWS:
                continue
            try:
                row = check_prompt(record, f"{part.path} {part.locate(index)}", tuple(needed))
            except JobError as exc:  # the columns seen so far stay: the rewards editor flags a column none has
                if isinstance(record, dict):
                    columns.update(dict.fromkeys(map(str, record)))
                return ObjectiveRecords(data_path, objective, tuple(columns), count=count, problem=exc.message,
                                        hint=exc.hint)
            if len(rows) < limit:
                columns.update(dict.fromkeys(map(str, row)))
                rows.append(_safely(row, render, {str(key): as_text(value) for key, value in row.items()}))
    if not count:
        return ObjectiveRecords(data_path, objective, problem=f"{data_path}: no records to train on",
                                hint="check data.path")
    return _with_template(ObjectiveRecords(data_path, objective, tuple(columns), tuple(rows), count, notes=notes),
                          render, special)


def _with_template(records: ObjectiveRecords, render: Render | None, special: tuple[str, ...]) -> ObjectiveRecords:
    if render is None or records.problem:
        return records
    return dataclasses.replace(records, templated=True, special=special)


def _preference_records(data_path: str, objective: str, limit: int, render: Render | None = None) -> ObjectiveRecords:
    """DPO pairs or KTO labelled answers as the trainer reads them (a pair unpaired for KTO)."""
    rows: list[dict[str, str]] = []
    count = 0
    try:
        for where, record in preference_shapes.each_record(resolve_resource(data_path)):
            count += 1
            if count > CHECKED_ROWS:
                continue
            if objective == "dpo":
                read = [preference_shapes.normalise_pair(record, where)]
            elif preference_shapes.is_pair(record) and not any(n in record for n in preference_shapes.LABEL_FIELDS):
                read = preference_shapes.unpair(preference_shapes.normalise_pair(record, where))
            else:
                read = [preference_shapes.normalise_unpaired(record, where)]
            rows.extend(_safely(row, render, {key: as_text(value) for key, value in row.items()})
                        for row in read if len(rows) < limit)
    except JobError as exc:
        return ObjectiveRecords(data_path, objective, count=count, problem=exc.message, hint=exc.hint)
    except (OSError, ValueError) as exc:
        return ObjectiveRecords(data_path, objective, problem=f"{data_path}: {exc}")
    if not count:
        return ObjectiveRecords(data_path, objective, problem=f"{data_path}: no records to train on",
                                hint="check data.path")
    return ObjectiveRecords(data_path, objective, FIELDS[objective], tuple(rows), count)


def reward_columns(rewards: Any) -> tuple[str, ...]:
    """The data columns GRPO's rewards read (an exact_match reward's `column`)."""
    if not isinstance(rewards, list):
        return ()
    return tuple(str(r.get("column") or "answer") for r in rewards
                 if isinstance(r, dict) and r.get("kind") == "exact_match")
