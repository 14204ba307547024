"""Exact match on held-out image rows: the conversation before a row's last answer, with its images, asked
greedily; the answer compared to the row's own after stripping (exact_match.is_match).

A VLM run's held-out prompts are its validation rows, cut exactly as training cut them (rows.py keeps each
row's conversation and images), so no separate prompts file with images is needed; rows whose last turn is
not the assistant's have nothing to compare and are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.core.data.conversation import IMAGE_MARKER
from backend.core.data.images import ImageRef
from backend.evaluation.exact_match import ExactMatchResult, is_match
from backend.evaluation.generation import stream_answer
from backend.evaluation.image_prompts import ImagePrompter


@dataclass(frozen=True)
class HeldOutImageRow:
    messages: list[dict[str, str]]  # up to the answer (ends with a user turn), `<image>` markers kept
    images: tuple[ImageRef, ...]  # those the prompt's markers stand for, in order
    expected: str

    @property
    def shown(self) -> str:
        """The last user turn on one line, an image written `<image>`: the prompt as a person reads it."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return " ".join((users[-1] if users else "").split())


def held_out_image_rows(eval_set: Any, conversations: list[list[dict[str, Any]]],
                        images: list[tuple[ImageRef, ...]], limit: int | None = None) -> list[HeldOutImageRow]:
    """The validation rows (each names its conversation by `row`) that end with an assistant answer."""
    out = []
    for i in range(len(eval_set)):
        row = eval_set[i]["row"]
        messages = conversations[row]
        if len(messages) < 2 or messages[-1]["role"] != "assistant" or messages[-2]["role"] != "user":
            continue
        prompt = [dict(m) for m in messages[:-1]]
        shown = sum(m["content"].count(IMAGE_MARKER) for m in prompt)
        out.append(HeldOutImageRow(prompt, tuple(images[row][:shown]), messages[-1]["content"]))
        if limit and len(out) == limit:
            break
    return out


def image_exact_match(model: Any, prompter: ImagePrompter, rows: list[HeldOutImageRow], max_new_tokens: int,
                      on_batch: Callable[[int, int], None] = lambda done, total: None) -> ExactMatchResult:
    """Greedy answers, one row at a time (each row's pixels are its own shape); on_batch(done, n) before the
    first and after each (it may raise to stop)."""
    answers: list[str] = []
    on_batch(0, len(rows))
    for done, row in enumerate(rows, start=1):
        text, _ = stream_answer(model, prompter.tokenizer, prompter.inputs(row.messages, row.images), lambda _: None,
                                max_new_tokens=max_new_tokens, temperature=0.0)
        answers.append(text.strip())
        on_batch(done, len(rows))
    hits = sum(is_match(a, r.expected) for a, r in zip(answers, rows))
    return ExactMatchResult(hits / len(rows) if rows else 0.0, hits, len(rows), answers)
