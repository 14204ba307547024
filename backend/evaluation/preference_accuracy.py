"""DPO's and KTO's measure: how the model ranks held-out answers, base vs tuned, by their log-probability.

DPO: the share of validation pairs whose chosen answer is more likely than the rejected one (the
`rewards/accuracies` DPO logs, on held-out pairs, for both models). KTO: the share of validation
answers whose log-probability the tuning moved the way their label asks (up for a desirable one,
down for an undesirable one), which needs both models' figures, so each answer's log-probability is
kept per model. Prompts and answers are rendered as training rendered them: through the chat template
where the rows are messages, concatenated where they are text; cut at train.seq_len as TRL cuts them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def _ids(tokenizer: Any, prompt: Any, answer: Any, seq_len: int) -> tuple[list[int], int]:
    """(token ids of prompt + answer, where the answer starts), the answer's end-of-turn included."""
    if isinstance(prompt, list):
        turns = answer if isinstance(answer, list) else [{"role": "assistant", "content": str(answer)}]
        head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(prompt + turns, tokenize=False)
    else:
        head, full = str(prompt), str(prompt) + str(answer)
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    start = len(head_ids) if ids[:len(head_ids)] == head_ids else max(1, len(head_ids) - 1)
    return ids[:seq_len], min(start, max(1, min(len(ids), seq_len) - 1))


@torch.no_grad()
def answer_logps(model: Any, tokenizer: Any, items: list[tuple[Any, Any]], seq_len: int,
                 on_item: Callable[[int, int], None] = lambda done, total: None) -> list[float]:
    """log p(answer | prompt) of each (prompt, answer), one row at a time (no padding to get wrong);
    progress before the first row and every 16 rows."""
    device = next(model.parameters()).device
    out: list[float] = []
    on_item(0, len(items))
    for index, (prompt, answer) in enumerate(items):
        ids, start = _ids(tokenizer, prompt, answer, seq_len)
        tensor = torch.tensor([ids], device=device)
        logits = model(input_ids=tensor).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(1, tensor[0, 1:, None])[:, 0]
        out.append(float(logp[start - 1:].sum()))
        if (index + 1) % 16 == 0 or index + 1 == len(items):
            on_item(index + 1, len(items))
    return out


def pair_accuracy(chosen: list[float], rejected: list[float]) -> dict[str, float]:
    """DPO: the share of pairs ranked right and the mean log-probability margin."""
    wins = sum(c > r for c, r in zip(chosen, rejected))
    margins = [c - r for c, r in zip(chosen, rejected)]
    return {"accuracy": wins / max(1, len(chosen)), "margin": sum(margins) / max(1, len(margins)), "n": len(chosen)}


def label_accuracy(base: list[float], tuned: list[float], labels: list[bool]) -> dict[str, float]:
    """KTO: the share of answers the tuning moved the way their label asks, over all and per label."""
    moved = [(t > b) == good for b, t, good in zip(base, tuned, labels)]
    good = [m for m, label in zip(moved, labels) if label]
    bad = [m for m, label in zip(moved, labels) if not label]
    share = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"accuracy": share(moved) or 0.0, "desirable": share(good), "undesirable": share(bad), "n": len(moved)}
