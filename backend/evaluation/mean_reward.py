"""GRPO's measure: the mean reward of the run's reward functions on held-out prompts, base vs tuned.

Each prompt of the run's validation split (cut exactly as training cut it) is answered `samples`
times at the run's temperature and max_completion_length, as GRPO sampled during training, and
scored by the run's reward functions; the mean reward is their weighted sum averaged over every
completion, beside each function's own mean. Seeded, so base and tuned see the same random stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from backend.evaluation.generation import greedy_answers, prompt_ids
from backend.training.objectives.rewards import RewardFn, completion_text


@dataclass
class RewardResult:
    mean: float
    per_function: dict[str, float]
    prompts: int
    completions: int
    answers: list[str] = field(default_factory=list)  # the first completion of each prompt

    def to_json(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 4), "per_function": {k: round(v, 4) for k, v in self.per_function.items()},
                "prompts": self.prompts, "completions": self.completions}


def _messages(prompt: Any) -> list[dict[str, str]]:
    return prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]


def mean_reward(model: Any, tokenizer: Any, rows: list[dict[str, Any]], functions: list[RewardFn],
                weights: list[float], samples: int, max_new_tokens: int, temperature: float, seed: int,
                batch_size: int = 16, on_batch: Callable[[int, int], None] = lambda done, total: None) -> RewardResult:
    """Score `samples` completions of every row's prompt; on_batch(done, n) with the prompts sampled in full,
    before the first batch and after each (it may raise to stop)."""
    torch.manual_seed(seed)
    expanded = [row for row in rows for _ in range(samples)]
    completions: list[str] = []
    on_batch(0, len(rows))
    for start in range(0, len(expanded), batch_size):
        chunk = expanded[start: start + batch_size]
        ids = [prompt_ids(tokenizer, _messages(row["prompt"])) for row in chunk]
        completions += greedy_answers(model, tokenizer, ids, max_new_tokens, temperature)
        on_batch(min(start + batch_size, len(expanded)) // max(samples, 1), len(rows))
    columns = {key: [row.get(key) for row in expanded] for key in (expanded[0] if expanded else {}) if key != "prompt"}
    prompts = [row["prompt"] for row in expanded]
    totals = [0.0] * len(expanded)
    per_function: dict[str, float] = {}
    for fn, weight in zip(functions, weights):
        scores = fn(prompts=prompts, completions=completions, **columns)
        present = [s for s in scores if s is not None]
        per_function[fn.__name__] = sum(present) / len(present) if present else float("nan")
        totals = [t + weight * (s or 0.0) for t, s in zip(totals, scores)]
    mean = sum(totals) / len(totals) if totals else float("nan")
    firsts = [completion_text(c) for c in completions[::samples]] if samples else []
    return RewardResult(mean, per_function, len(rows), len(expanded), firsts)
