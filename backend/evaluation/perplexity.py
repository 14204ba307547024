"""Perplexity on the validation split: exp of the mean negative log-likelihood per trained token.

Only tokens that carry a label count (the prompt tokens are masked with -100, as in training), and
the mean is over tokens, not over batches, so the figure does not depend on the batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from backend.evaluation.generation import on_model
from backend.training.tokenized import IGNORE, PadCollator


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    loss: float  # mean negative log-likelihood per token (nats)
    tokens: int
    examples: int

    def to_json(self) -> dict[str, Any]:
        return {"perplexity": round(self.perplexity, 4), "loss": round(self.loss, 5), "tokens": self.tokens,
                "examples": self.examples}


@torch.no_grad()
def perplexity(model: Any, rows: Any, pad_id: int, batch_size: int,
               on_batch: Callable[[int, int], None] = lambda done, total: None,
               collate: Callable[[list[Any]], dict[str, Any]] | None = None) -> PerplexityResult:
    """rows: a dataset of {input_ids, labels}; on_batch(done, n) with the examples measured, before the first
    batch and after each (it may raise to stop), so a slow first batch already shows its count. collate:
    a VLM's image collator (training/vision/collator.py), whose pixel tensors go to the model beside the ids."""
    collate = collate or PadCollator(pad_id)
    total_nll, total_tokens = 0.0, 0
    n = len(rows)
    on_batch(0, n)
    for start in range(0, n, batch_size):
        batch = collate([rows[i] for i in range(start, min(start + batch_size, n))])
        labels = batch["labels"]
        logits = model(**on_model(model, {k: v for k, v in batch.items() if k != "labels"})).logits
        # Position t predicts token t+1; masked labels (-100) are ignored, as in training.
        # One row at a time, so only one row of logits is ever upcast to fp32.
        shifted = labels[:, 1:].to(logits.device)
        for row in range(logits.shape[0]):
            total_nll += float(torch.nn.functional.cross_entropy(
                logits[row, :-1].float(), shifted[row], ignore_index=IGNORE, reduction="sum"))
        total_tokens += int((shifted != IGNORE).sum())
        del logits
        on_batch(min(start + batch_size, n), n)
    loss = total_nll / max(total_tokens, 1)
    return PerplexityResult(math.exp(min(loss, 700.0)), loss, total_tokens, n)
