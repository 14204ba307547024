"""What serving an export takes: the serving estimate (how much of a card, the `vllm serve` line) and the servers.

kv_cache.py counts the KV cache (per token, per sequence, sliding windows at their window),
weights.py the weights by export format (calibrated.py: a compressed-tensors export's from its files), sizing.py vLLM's memory split and solves it for
max_num_seqs at a context and for the context at a concurrency, source.py finds the model in a run,
export or model folder. `estimate_serving` ties them together for the CLI. engines.py and
server_process.py run the chosen server (tf_server.py is transformers' own, behind a token). Torch-free here.
"""

from __future__ import annotations

from typing import Any

from backend.estimate.families import read_dims
from backend.serving.kv_cache import KVLayout
from backend.serving.sizing import Card, ServePlan, Sizing, vllm_command
from backend.serving.source import ServeSource, max_positions, resolve

__all__ = ["Card", "KVLayout", "ServePlan", "ServeSource", "Sizing", "estimate_serving", "resolve", "vllm_command"]


def estimate_serving(source: ServeSource, card: Card, context: int | None, concurrency: int | None) -> dict[str, Any]:
    """Both answers for one model on one card, as a JSON-ready dict: the most sequences at `context`
    (default: 4096 or the model's positions if fewer) and, when `concurrency` is given, the longest
    context for that many; each with its vLLM line. Raises a one-line ValueError for a bad config."""
    arch, dims, warnings = read_dims(source.config)
    positions = max_positions(source.config)
    if context is not None and context > positions:
        raise ValueError(f"--context {context}: the model takes at most {positions:,} tokens "
                         "(max_position_embeddings); vLLM refuses a longer --max-model-len")
    sizing = Sizing(arch, dims, source.fmt, card, positions, source.lora_rank, source.weight_files)
    result: dict[str, Any] = {
        "model": source.serve_path, "format": source.fmt, "model_type": dims.model_type,
        "card_gb": card.gb, "gpu_memory_utilization": card.utilization, "tensor_parallel_size": card.tensor_parallel,
        "block_size": card.block_size, "max_num_batched_tokens": card.batched_tokens,
        "weights_how": sizing.weights.how, "parameters": sizing.weights.params, "kv_formula": sizing.kv.describe(),
        "kv_per_token_bytes": sizing.kv.token_bytes, "notes": list(source.notes) + warnings, "plans": [],
    }
    blocker = sizing.does_not_fit()
    if blocker:
        result["does_not_fit"] = blocker
        return result
    asked = [("context", sizing.seqs_at(context or min(4096, positions)))]
    if concurrency is not None:
        asked.append(("concurrency", sizing.context_at(concurrency)))
    for given, plan in asked:
        entry = {"given": given, **plan.to_json()}
        if plan.max_num_seqs and plan.context:
            entry["vllm"] = vllm_command(source.serve_path, plan, card, source.flags)
        result["plans"].append(entry)
    return result
