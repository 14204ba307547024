"""Measuring an export against the trained model: next-token choices and perplexity on a fixed token budget.

`build_probe` fixes what is measured once per export: four chat prompts rendered with the run's own
template and examples of the run's validation split, then of its training data (the bundled
demo_eval set when the data file is gone), cut to a budget of tokens fed to the model
(TOKEN_BUDGET, QUANTIZED_BUDGET for formats with a wider tolerance: it bounds the check's time on the
CPU, and the longest sequence bounds its logits in memory). `measure` runs one 16-bit model over them
and keeps only small summaries (the top-5 logits of every scored position, the negative
log-likelihood of every answer token and each row's count of them, the prompts' logits); `compare`
turns two measurements into the figures of export_report.json (the perplexity increase's row-level
standard error: check_statistics) and `perplexity_check` / `top1_check` into pass or fail
(tolerances: formats.py, reasoning: docs/export.md).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from backend.core.config.run_config import RunConfig
from backend.core.registries.export_formats import DECIDED_MARGIN
from backend.core.runs.export_report import FAILED, PASSED
from backend.export.check_statistics import Increase, precision, relative_increase
from backend.core.paths import resolve_resource
from backend.training.tokenized import IGNORE, build_datasets, encode_conversation

log = logging.getLogger(__name__)
TOKEN_BUDGET = {"cuda": 4096, "cpu": 512}
"""Tokens fed to each model per check (prompts + examples); the CPU's is smaller because it is slow."""
QUANTIZED_BUDGET = {"cuda": 16384, "cpu": 4096}
"""The same for a format whose perplexity tolerance is wider than 16-bit rounding's (PRECISE): a 4-bit
export's increase varies more from row to row, and its standard error must stay under a fifth of the
tolerance (check_statistics); bounded so that the check stays below a calibrated export's calibration."""
PRECISE = 0.03
"""The widest 16-bit tolerance (bf16): formats above it are quantized and get QUANTIZED_BUDGET."""
MAX_SEQUENCE = 512
"""Most tokens (padding included) in one forward pass: its logits (MAX_SEQUENCE x vocabulary, 16-bit) are
the check's largest buffer."""
TOP_K = 5
CHUNK = 128  # positions whose logits are widened to fp32 at a time
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
    budget: int
    pad_id: int = 0

    @property
    def tokens(self) -> int:
        return sum(len(p) for p in self.prompts) + sum(len(r["input_ids"]) for r in self.rows)

    def describe(self) -> str:
        answers = sum(sum(1 for x in r["labels"][1:] if x != IGNORE) for r in self.rows)
        return (f"{len(self.prompts)} fixed prompts and {len(self.rows)} examples of {self.source}: "
                f"{self.tokens} tokens fed (budget {self.budget}), {answers} answer tokens scored")


@dataclass
class Measurement:
    top_values: torch.Tensor  # (positions, TOP_K) fp32: every prompt position, then every answer position
    top_ids: torch.Tensor  # (positions, TOP_K)
    nll: torch.Tensor  # (answer tokens,) fp32
    prompt_logits: list[torch.Tensor]  # per prompt (length, vocabulary), in the model's dtype, on the CPU
    seconds: float
    row_tokens: list[int] = field(default_factory=list)  # answer tokens of each row, in nll's order

    @property
    def perplexity(self) -> float:
        return math.exp(min(float(self.nll.double().mean()) if self.nll.numel() else 0.0, 700.0))

    @property
    def tokens(self) -> int:
        return int(self.nll.numel())


def build_probe(config: RunConfig, tokenizer: Any, device: str, max_increase: float = PRECISE,
                calibrated: bool = False) -> Probe:
    """The probe of a format whose perplexity tolerance is `max_increase`: a wider one gets more tokens on a GPU,
    and on a CPU only where the export is calibrated, whose calibration already takes far longer than the
    check (a 1 B GGUF's check on 2 CPU cores would go from minutes to a quarter of an hour each way; its
    report says when its standard error is wider than a fifth of the tolerance)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    wide = max_increase > PRECISE and (kind == "cuda" or calibrated)
    budget = (QUANTIZED_BUDGET if wide else TOKEN_BUDGET)[kind]
    prompts = [tokenize_prompt(tokenizer, text)[-MAX_SEQUENCE:] for text in PROMPTS]
    left = budget - sum(len(p) for p in prompts)
    rows: list[dict[str, list[int]]] = []
    used: list[str] = []
    for candidates, source in _row_sources(config, tokenizer):
        taken = len(rows)
        for row in candidates:
            # A row with images runs alone and is never cut; the first one is taken whatever its length.
            row = _window(row, (left if rows else max(left, len(row["input_ids"]))) if "inputs" in row
                          else min(MAX_SEQUENCE, left))
            if row is None:
                break
            rows.append(row)
            left -= len(row["input_ids"])
        if len(rows) > taken:
            used.append(source if len(rows) - taken < len(candidates) else f"{source} (all {len(candidates)} rows)")
        if len(rows) - taken < len(candidates):  # the budget is spent
            break
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    return Probe(prompts, rows, ", then ".join(used) or "no rows", budget, int(pad))


def _window(row: dict[str, list[int]], limit: int) -> dict[str, list[int]] | None:
    """The row, or its last `limit` tokens up to its last answer token when longer; None when no answer fits
    (a row with images, whose tokens cannot be cut: None when longer)."""
    ids, labels = list(row["input_ids"]), list(row["labels"])
    answered = [i for i, x in enumerate(labels) if x != IGNORE and i > 0]
    if not answered or limit < 2:
        return None
    if "inputs" in row:
        return row if len(ids) <= limit else None
    if len(ids) > limit:
        end = answered[-1] + 1
        start = max(0, end - limit)
        ids, labels = ids[start:end], labels[start:end]
        if not any(x != IGNORE for x in labels[1:]):
            return None
    return {"input_ids": ids, "labels": labels}


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


def perplexity_rows(config: RunConfig, tokenizer: Any) -> tuple[list[dict[str, list[int]]], str]:
    """The tokenized rows a check scores (the validation split, then the training rows), and where from:
    shared with the calibrated exports, which calibrate on the same rows."""
    parts = _row_sources(config, tokenizer)
    return [row for rows, _ in parts for row in rows], ", then ".join(source for _, source in parts)


def _row_sources(config: RunConfig, tokenizer: Any) -> list[tuple[list[dict[str, list[int]]], str]]:
    """(rows, where from) in the order a probe takes them: the validation split first, then training rows, which
    measure an export's fidelity as well when a quantized check needs more rows than the split has."""
    from backend.core.data.records import detect_format, read_records, to_conversation
    from backend.core.vision_folder import VisionFolder

    if VisionFolder.read(config.resolved_model_path()).family is not None:  # its image rows, with their images
        from backend.export.vision_probe import image_row_sources

        return image_row_sources(config)
    try:
        train, evaluation, _ = build_datasets(config, tokenizer)
        training = [train[i] for i in range(min(1024, len(train)))]
        if evaluation is not None and len(evaluation):
            return [([evaluation[i] for i in range(len(evaluation))], "the run's validation split"),
                    (training, "its training data")]
        return [(training, "the run's training data (it has no validation split)")]
    except Exception as exc:  # the data file moved or changed: fall back to the bundled eval set
        log.warning("run data unusable for perplexity (%s); using the bundled demo_eval set", exc)
    path = resolve_resource("bundled:datasets/demo_eval.jsonl")
    records = read_records(path)
    fmt = detect_format(records, path)
    rows = []
    for index, record in enumerate(records):
        ids, labels = encode_conversation(tokenizer, to_conversation(record, fmt, f"{path} record {index + 1}"))
        rows.append({"input_ids": ids, "labels": labels})
    return [(rows, "the bundled demo_eval set (the run's data could not be read)")]


# --- running a model ----------------------------------------------------------------------------


def _device_of(model: Any) -> torch.device:
    try:
        return next(p.device for p in model.parameters() if p.device.type != "meta")
    except StopIteration:
        return torch.device("cpu")


def fp32_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A 16-bit Linear's fp32 product, a slice of weight rows at a time, each rounded into the 16-bit output."""
    weight, x32 = self.weight, x.float()
    rows = max(1, (1 << 24) // max(weight.shape[1], 1))  # ~64 MB of fp32 weight; no whole fp32 output (memory)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)
    for i in range(0, weight.shape[0], rows):
        part = torch.nn.functional.linear(x32, weight[i:i + rows].float())
        if self.bias is not None:
            part += self.bias[i:i + rows].float()
        out[..., i:i + rows] = part
    return out


@contextlib.contextmanager
def cpu_products_in_fp32(model: Any) -> Iterator[None]:
    """On a CPU, the 16-bit Linear layers multiply in fp32 (as a GPU's 16-bit matmul accumulates in fp32):
    CPUs without native bf16 run 16-bit products several times slower. Weights and activations stay 16-bit."""
    if _device_of(model).type != "cpu":
        yield
        return
    patched = []
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype in (torch.bfloat16, torch.float16):
            module.forward = types.MethodType(fp32_linear, module)
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """bitsandbytes logs on every 8-bit forward that it casts the input to fp16, which is how it works."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@torch.no_grad()
def measure(model: Any, probe: Probe, should_stop: Callable[[], bool] | None = None) -> Measurement:
    """Run the model over the probe, sequences right-padded into batches of at most MAX_SEQUENCE tokens
    (every forward pass reads every weight, so few passes matter more than little padding).
    `should_stop` is asked between passes: InterruptedError when it says so."""
    began = time.monotonic()
    device = _device_of(model)
    values, ids, nll, prompt_logits, row_tokens = [], [], [], [], []
    sequences = [(p, None) for p in probe.prompts] + [(r["input_ids"], r["labels"]) for r in probe.rows]
    images = {id(r["input_ids"]): r["inputs"] for r in probe.rows if "inputs" in r}
    with cpu_products_in_fp32(model), _quiet("bitsandbytes.autograd._functions"):
        for batch in _batches(sequences, set(images)):
            if should_stop and should_stop():
                raise InterruptedError("stop requested")
            width = max(len(s) for s, _ in batch)
            tokens = torch.full((len(batch), width), probe.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (seq, _) in enumerate(batch):
                tokens[i, :len(seq)] = torch.tensor(seq)
                mask[i, :len(seq)] = 1
            inputs = images.get(id(batch[0][0])) if len(batch) == 1 else None
            if inputs is not None:  # a row with images: the processor's tensors, pixels and all
                from backend.export.vision_probe import forward_inputs

                logits = model(**forward_inputs(model, inputs, device)).logits
            else:
                logits = model(input_ids=tokens.to(device), attention_mask=mask.to(device)).logits
            for i, (seq, labels) in enumerate(batch):
                row = logits[i, :len(seq)]
                if labels is None:
                    prompt_logits.append(row.cpu().clone())
                    _summarize(row, torch.arange(len(seq), device=device), None, values, ids, nll)
                else:
                    shifted = torch.tensor(labels[1:], device=device)
                    positions = torch.nonzero(shifted != IGNORE).flatten()
                    row_tokens.append(int(positions.numel()))
                    _summarize(row, positions, shifted[positions], values, ids, nll)
            del logits
    return Measurement(torch.cat(values), torch.cat(ids), torch.cat(nll) if nll else torch.zeros(0),
                       prompt_logits, time.monotonic() - began, row_tokens)


def _batches(sequences: list, alone: set[int] = frozenset()) -> Iterator[list]:
    """Batches of at most MAX_SEQUENCE tokens; a sequence whose id is in `alone` (a row with images) goes by itself."""
    batch: list = []
    for item in sequences:
        if id(item[0]) in alone:
            if batch:
                yield batch
                batch = []
            yield [item]
            continue
        width = max([len(item[0])] + [len(s) for s, _ in batch])
        if batch and width * (len(batch) + 1) > MAX_SEQUENCE:
            yield batch
            batch = []
        batch.append(item)
    if batch:
        yield batch


def _summarize(logits: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor | None,
               values: list, ids: list, nll: list) -> None:
    for start in range(0, len(positions), CHUNK):
        chunk = logits[positions[start:start + CHUNK]].float()
        top = chunk.topk(TOP_K, dim=-1)
        values.append(top.values.cpu())
        ids.append(top.indices.cpu())
        if targets is not None:
            picked = chunk.gather(1, targets[start:start + CHUNK, None])[:, 0]
            nll.append((torch.logsumexp(chunk, dim=-1) - picked).cpu())


# --- comparing ----------------------------------------------------------------------------------


def compare(reference: Measurement, candidate: Measurement) -> dict[str, Any]:
    """Figures of the candidate against the reference (same probe)."""
    ref_top, got_top = reference.top_ids[:, 0], candidate.top_ids[:, 0]
    margin = reference.top_values[:, 0] - reference.top_values[:, 1]
    decided = margin >= DECIDED_MARGIN
    agree = ref_top == got_top
    increase = relative_increase((candidate.nll.double() - reference.nll.double()).tolist(), candidate.row_tokens)
    max_diff = max(((a.float() - b.float()).abs().max().item() for a, b in
                    zip(reference.prompt_logits, candidate.prompt_logits)), default=0.0)
    return {
        "positions": int(agree.numel()),
        "top1_agreement": float(agree.float().mean()) if agree.numel() else 1.0,
        "decided_positions": int(decided.sum()),
        "top1_agreement_decided": float(agree[decided].float().mean()) if decided.any() else None,
        "reference_perplexity": reference.perplexity,
        "export_perplexity": candidate.perplexity,
        "relative_increase": increase.relative,
        "increase_standard_error": increase.standard_error,  # per row, delta method: check_statistics
        "tokens": increase.tokens,
        "rows": increase.rows,
        "max_abs_logit_diff": max_diff,
        "max_abs_logit": max((a.float().abs().max().item() for a in reference.prompt_logits), default=0.0),
    }


def perplexity_check(figures: dict[str, Any], tolerance: float, source: str) -> dict[str, Any]:
    """Decided by the tolerance alone; its standard error and whether that is under a fifth of the tolerance are
    reported beside it (check_statistics.precision)."""
    measured = figures["relative_increase"]
    increase = Increase(measured, figures["increase_standard_error"], figures["tokens"], figures["rows"])
    return {
        "name": "perplexity",
        "what": f"relative perplexity increase over the trained model's, on {figures['tokens']} answer tokens in "
                f"{figures['rows']} rows of {source}",
        "measured": measured,
        "tolerance": tolerance,
        "outcome": PASSED if measured <= tolerance else FAILED,
        "passed": bool(measured <= tolerance),
        **precision(increase, tolerance),
        "figures": {k: figures[k] for k in ("reference_perplexity", "export_perplexity", "relative_increase",
                                            "increase_standard_error", "tokens", "rows")},
    }


def top1_check(figures: dict[str, Any], tolerance: float) -> dict[str, Any]:
    measured = figures["top1_agreement_decided"]
    return {
        "name": "top1",
        "what": f"share of the positions where the trained model's first choice leads its second by at least "
                f"{DECIDED_MARGIN:g} logit ({figures['decided_positions']} of {figures['positions']}) at which the "
                "export picks the same next token",
        "measured": measured if measured is not None else "no such position",
        "tolerance": tolerance,
        "outcome": PASSED if measured is None or measured >= tolerance else FAILED,
        "passed": bool(measured is None or measured >= tolerance),
        "figures": {k: figures[k] for k in ("positions", "top1_agreement", "decided_positions",
                                            "top1_agreement_decided")},
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
        "outcome": FAILED if failures else PASSED,
        "passed": not failures,
    }
