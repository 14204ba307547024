"""Measuring an export against the trained model: logits on fixed prompts, perplexity on held-out data.

`Probe` fixes what is measured once per export: a few chat prompts rendered with the run's own
template, and up to MAX_ROWS examples of the run's validation split (its training data when it has
none, the bundled demo_eval set when the data file is gone). `measure` runs one model over them in
fp32; `compare_*` turn two measurements into the checks written to export_report.json.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from backend.config import RunConfig
from backend.paths import resolve_resource
from backend.training.data import IGNORE, PadCollator, build_datasets, encode_conversation

log = logging.getLogger(__name__)
MAX_ROWS = 64
BATCH = 8
PROMPTS = (
    "What is the capital of France?",
    "Reverse the order of these words: river stone light",
    "How many words are there? Answer with a number: one two three four",
    "Write one short sentence about the sea.",
)


@dataclass
class Probe:
    prompts: list[list[int]]
    rows: list[dict[str, list[int]]]
    source: str  # where the perplexity rows came from, in words


@dataclass
class Measurement:
    logits: list[torch.Tensor]
    nll: float  # mean negative log-likelihood per predicted token
    tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nll, 700.0))


def build_probe(config: RunConfig, tokenizer: Any) -> Probe:
    prompts = [tokenize_prompt(tokenizer, text) for text in PROMPTS]
    rows, source = _perplexity_rows(config, tokenizer)
    return Probe(prompts, rows, source)


def prompt_texts(tokenizer: Any) -> list[str]:
    """The fixed prompts as the text a runtime would tokenize (chat template applied when there is one)."""
    if getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True) for text in PROMPTS]
    return list(PROMPTS)


def tokenize_prompt(tokenizer: Any, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def _perplexity_rows(config: RunConfig, tokenizer: Any) -> tuple[list[dict[str, list[int]]], str]:
    from backend.training.records import detect_format, read_records, to_conversation

    try:
        train, evaluation, _ = build_datasets(config, tokenizer)
        if evaluation is not None and len(evaluation):
            rows = [evaluation[i] for i in range(min(MAX_ROWS, len(evaluation)))]
            return rows, f"the run's validation split ({len(rows)} of {len(evaluation)} examples)"
        rows = [train[i] for i in range(min(MAX_ROWS, len(train)))]
        return rows, f"the run's training data ({len(rows)} examples; it has no validation split)"
    except Exception as exc:  # the data file moved or changed: fall back to the bundled eval set
        log.warning("run data unusable for perplexity (%s); using the bundled demo_eval set", exc)
    path = resolve_resource("bundled:datasets/demo_eval.jsonl")
    records = read_records(path)[:MAX_ROWS]
    fmt = detect_format(records, path)
    rows = []
    for index, record in enumerate(records):
        ids, labels = encode_conversation(tokenizer, to_conversation(record, fmt, f"{path} record {index + 1}"))
        rows.append({"input_ids": ids[: config.train.seq_len], "labels": labels[: config.train.seq_len]})
    return rows, f"the bundled demo_eval set ({len(rows)} examples; the run's data could not be read)"


def _device_of(model: Any) -> torch.device:
    try:
        return next(p.device for p in model.parameters() if p.device.type != "meta")
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def measure(model: Any, probe: Probe, pad_id: int) -> Measurement:
    """Logits on the prompts (every position, fp32, on the CPU) and perplexity on the rows."""
    device = _device_of(model)
    logits = []
    for ids in probe.prompts:
        out = model(input_ids=torch.tensor([ids], device=device)).logits[0]
        logits.append(out.float().cpu())
    total, count = 0.0, 0
    for start in range(0, len(probe.rows), BATCH):
        padded = PadCollator(pad_id)(probe.rows[start:start + BATCH])  # the padding training used
        ids, labels, mask = padded["input_ids"], padded["labels"], padded["attention_mask"]
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().cpu()
        shift_logits, shift_labels = out[:, :-1], labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
            ignore_index=IGNORE, reduction="sum",
        )
        total += loss.item()
        count += int((shift_labels != IGNORE).sum())
    return Measurement(logits, total / max(count, 1), count)


def logit_figures(reference: Measurement, candidate: Measurement) -> dict[str, float]:
    diffs = [(a - b).abs().max().item() for a, b in zip(reference.logits, candidate.logits)]
    scale = max(a.abs().max().item() for a in reference.logits)
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(reference.logits, candidate.logits))
    positions = sum(a.shape[0] for a in reference.logits)
    return {
        "max_abs_logit_diff": max(diffs),
        "max_abs_logit": scale,
        "top1_agreement": agree / max(positions, 1),
        "positions": positions,
    }


def perplexity_figures(reference: Measurement, candidate: Measurement) -> dict[str, float]:
    return {
        "reference_perplexity": reference.perplexity,
        "export_perplexity": candidate.perplexity,
        "relative_increase": candidate.perplexity / reference.perplexity - 1.0,
        "tokens": candidate.tokens,
    }


def logit_check(reference: Measurement, candidate: Measurement, tolerance: float) -> dict[str, Any]:
    figures = logit_figures(reference, candidate)
    measured = figures["max_abs_logit_diff"]
    return {
        "name": "logits",
        "what": "largest |logit difference| against the trained model (base + adapter, fp32) at every "
                f"position of {len(reference.logits)} fixed prompts",
        "measured": measured,
        "tolerance": tolerance,
        "passed": bool(measured <= tolerance),
        "figures": figures,
    }


def perplexity_check(reference: Measurement, candidate: Measurement, tolerance: float, source: str) -> dict[str, Any]:
    figures = perplexity_figures(reference, candidate)
    measured = figures["relative_increase"]
    return {
        "name": "perplexity",
        "what": f"relative perplexity increase over the trained model's on {source}",
        "measured": measured,
        "tolerance": tolerance,
        "passed": bool(measured <= tolerance),
        "figures": figures,
    }


def tokenizer_check(reference: Any, exported: Any) -> dict[str, Any]:
    """The exported tokenizer renders and encodes the fixed prompts exactly like the run's."""
    texts = prompt_texts(reference)
    same_template = getattr(reference, "chat_template", None) == getattr(exported, "chat_template", None)
    same_ids = all(reference(t, add_special_tokens=False)["input_ids"] == exported(t, add_special_tokens=False)["input_ids"]
                   for t in texts)
    same_specials = all(getattr(reference, k) == getattr(exported, k)
                        for k in ("bos_token_id", "eos_token_id", "pad_token_id"))
    failures = [name for name, ok in (("chat template", same_template), ("token ids", same_ids),
                                      ("special tokens", same_specials)) if not ok]
    return {
        "name": "tokenizer",
        "what": "chat template, special tokens and the token ids of the fixed prompts match the run's tokenizer",
        "measured": "identical" if not failures else "differs: " + ", ".join(failures),
        "tolerance": "identical",
        "passed": not failures,
    }
