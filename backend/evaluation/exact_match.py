"""Exact match: greedy answers to held-out prompts, compared to the expected text after stripping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.evaluation.generation import greedy_answers, prompt_ids
from backend.evaluation.prompts import HeldOutPrompt


@dataclass(frozen=True)
class ExactMatchResult:
    accuracy: float
    hits: int
    n: int
    answers: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": round(self.accuracy, 4), "hits": self.hits, "n": self.n}


def is_match(answer: str, expected: str) -> bool:
    return answer.strip() == expected.strip()


def exact_match(model: Any, tokenizer: Any, prompts: list[HeldOutPrompt], max_new_tokens: int, batch_size: int = 16,
                on_batch: Callable[[int, int], None] = lambda done, total: None) -> ExactMatchResult:
    """on_batch(done, n) with the prompts answered, before the first batch and after each (it may raise to stop)."""
    answers: list[str] = []
    on_batch(0, len(prompts))
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start: start + batch_size]
        answers += greedy_answers(model, tokenizer, [prompt_ids(tokenizer, p.messages) for p in chunk], max_new_tokens)
        on_batch(min(start + batch_size, len(prompts)), len(prompts))
    hits = sum(is_match(a, p.expected) for a, p in zip(answers, prompts))
    return ExactMatchResult(hits / len(prompts) if prompts else 0.0, hits, len(prompts), answers)
