"""`finetune-studio serve-estimate RUN_OR_MODEL_DIR --card-gb 24`: how an export serves on a card.

Prints the memory split (weights, KV cache per token, activations, runtime), the most sequences at
a context and the longest context at a concurrency that fit in gpu_memory_utilization x the card,
and the `vllm serve` line with those numbers (printed, never run). Torch-free. Exit status: 0 when every
plan asked for fits; 1 when one does not (the weights alone, or not one sequence of that context, or not
that many sequences): the verdict's one line first, "does not fit: ...", then the figures; 2 for a bad
folder, flag or config.json (one line), as every bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from backend.cli.checks import positive_int, probability
from backend.core.config.run_config import ConfigError
from backend.estimate.breakdown import GIB
from backend.serving import Card, estimate_serving, resolve
from backend.serving.sizing import BATCHED_TOKENS, BLOCK_SIZE, UTILIZATION, VLLM_GAPS
from backend.core.registries.serving_options import SERVED_FORMATS


CARD_GB_HELP = ("memory of one GPU as the card reports its total, in GiB (nvidia-smi's MiB / 1024; a card sold "
                "as 24 GB reports about 24), e.g. 24")
"""--card-gb's help, shared by serve-estimate and serve: vLLM sizes from the total the card reports."""


def card_gb(text: str) -> float:
    """A card size in GiB: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GB") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0 (got {text})")
    return value


def add_serve_estimate_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve-estimate", help="size a vLLM server for an export on a card: max_num_seqs, context, the command line",
        description="Predict what an exported model needs on a GPU under vLLM (weights, KV cache, activations, runtime)\n"
                    "and print the `vllm serve` line whose --max-num-seqs and --max-model-len fit in\n"
                    "--gpu-memory-utilization x the card. Nothing is started.\n\n"
                    "exit status: 0 when every plan asked for fits; 1 when one does not fit (the weights alone,\n"
                    "or not one sequence of --context, or not --concurrency sequences): a one-line verdict\n"
                    "\"does not fit: ...\" first, then the figures; 2 for bad input (a folder, flag or config.json).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="RUN_OR_MODEL_DIR",
                        help="a run folder (its export, or its base with the adapter), an export folder, or a model "
                             "folder with config.json (config.json alone is enough)")
    parser.add_argument("--card-gb", type=card_gb, required=True, help=CARD_GB_HELP)
    parser.add_argument("--context", type=positive_int, default=None,
                        help="tokens per sequence (prompt + answer) to size max_num_seqs for (default 4096, or the "
                             "model's positions if fewer)")
    parser.add_argument("--concurrency", type=positive_int, default=None,
                        help="sequences at once to size the longest context for")
    parser.add_argument("--format", choices=list(SERVED_FORMATS), default=None,
                        help="export format served (default: the export's own; a run's first export; else merged)")
    parser.add_argument("--gpu-memory-utilization", type=probability, default=UTILIZATION,
                        help=f"share of the card vLLM may use (vLLM's default {UTILIZATION})")
    parser.add_argument("--tensor-parallel", type=positive_int, default=1, help="GPUs the model is split over")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(func=cmd_serve_estimate)
    return parser


def cmd_serve_estimate(args: argparse.Namespace) -> int:
    card = Card(args.card_gb, args.gpu_memory_utilization, args.tensor_parallel, BLOCK_SIZE, BATCHED_TOKENS)
    try:
        result = estimate_serving(resolve(args.model, args.format), card, args.context, args.concurrency)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(json.dumps(result) if args.json else format_result(result))
    return 1 if result.get("does_not_fit") else 0


def _gib(value: int) -> str:
    """GiB to two places; MiB below a hundredth of a GiB, where GiB would print 0.00."""
    return f"{value / GIB:.2f} GiB" if value >= GIB / 100 else f"{value / 2**20:.2f} MiB"


def format_result(r: dict[str, Any]) -> str:
    """The figures as lines for a terminal."""
    per_gpu = f", per GPU of {r['tensor_parallel_size']}" if r["tensor_parallel_size"] > 1 else ""
    lines = [f"does not fit: {r['does_not_fit']}"] if r.get("does_not_fit") else []  # the verdict first
    lines += [f"model:       {r['model']} ({r['format']}, {r['model_type']}, {r['parameters'] / 1e9:.2f} B parameters)",
              f"card:        {r['gpu_memory_utilization']:g} x {r['card_gb']:g} GiB = "
              f"{_gib(int(r['card_gb'] * GIB * r['gpu_memory_utilization']))} for vLLM{per_gpu}",
              f"KV cache:    {r['kv_formula']}"]
    plans = r["plans"]
    if plans:
        first = plans[0]
        lines += [f"weights:     {_gib(first['weights'])} ({r['weights_how']})",
                  f"runtime:     {_gib(first['runtime'])} (the cuBLAS workspace; the CUDA context lies outside "
                  "vLLM's budget)",
                  f"activations: {_gib(first['activations'])} (vLLM's profile run: one layer over "
                  f"{r['max_num_batched_tokens']} tokens + the sampler's rows; an assumption, vLLM measures it)"]
    for plan in plans:
        per_seq = _gib(plan["kv_per_sequence"])
        if plan["given"] == "context":
            lines.append(f"\nat {plan['context']:,} tokens of context: max_num_seqs {plan['max_num_seqs']} "
                         f"({per_seq} of KV cache each, {_gib(plan['kv_budget'])} free for it)")
        else:
            lines.append(f"\n{plan['max_num_seqs']} sequences at once: context up to {plan['context']:,} tokens "
                         f"({per_seq} of KV cache each, {_gib(plan['kv_budget'])} free for it)")
        lines += [f"  note: {note}" for note in plan["notes"]]
        if plan.get("vllm"):
            lines.append(f"  {plan['vllm']}")
        else:
            lines.append(f"  nothing fits: {plan['max_num_seqs']} sequences cannot each hold even one token" if
                         plan["given"] == "concurrency" else "  nothing fits: not one sequence of that length")
    lines += [f"note: {note}" for note in r["notes"]]
    lines.append("note: every sequence is counted at its full context at once (vLLM preempts past that)")
    lines.append(f"note: {VLLM_GAPS}")
    return "\n".join(lines)
