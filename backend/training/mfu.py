"""Model FLOPs utilisation: how much of the machine's measured peak the training step uses.

FLOPs per computed token follow the usual convention: 6 per matmul weight for the forward and
backward passes (2 forward, 2 for the input's gradient, 2 for the weight's: Kaplan et al. 2020), plus
the attention term 12 * layers * heads * head_dim * context (PaLM, Chowdhery et al. 2022, appendix B).
A frozen weight (the base under LoRA) gets no weight gradient, so it counts 4, not 6: counting 6N
for a LoRA run credited work nobody does. Adapters count 6 per weight like any trained weight.
A MoE's fused experts count top-k / experts of their weights per token (each token runs k experts);
6 where their weights are trained or adapted (peft's ParamWrapper adds the adapter to the weight, so
the weight's gradient is computed), 4 where frozen; the ParamWrapper's own factors are formed once
a step, not per token, and are not counted. GPT-2's Conv1D counts like nn.Linear.

Only FLOPs that run are counted, so the shortcuts' skipped work is not credited: `TokenFlops`
splits a token's FLOPs into what every computed token costs, what only a position whose logits are
computed costs (the output projection: with loss_positions, only at target positions), and what only
a row of the last layer's patched MLP and o_proj costs (with last_layer_rows, only at those rows).
SupervisedCountingTrainer counts the three kinds of positions per step, padding excluded everywhere. The
recomputation of activation checkpointing is not counted (MFU, not hardware FLOPs utilisation).

The peak is not a datasheet number: it is measured once per machine, device, dtype and thread count
with a large matmul, and cached under the studio home, so MFU on a laptop CPU is as honest as on a GPU.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from backend.core.paths import studio_home

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenFlops:
    every: float  # per computed token: all matmuls but the two kinds below, plus attention
    head: float  # per position whose logits are computed
    last_rows: float  # per row the last layer's MLP and attention output projection run on

    def of(self, tokens: float, heads: float, rows: float) -> float:
        return self.every * tokens + self.head * heads + self.last_rows * rows

    @property
    def per_token(self) -> float:
        """A token's FLOPs when every position is computed (no shortcut)."""
        return self.every + self.head + self.last_rows


def _matmul_modules(model: Any) -> Iterable[tuple[torch.nn.Module, float, bool]]:
    """(module, weights a token is multiplied by, trained?) for every matmul weight, adapters included."""
    config = getattr(model, "config", None)
    once_a_step: set[int] = set()  # ParamWrapper factors: formed into the weight once per step
    adapted: set[int] = set()  # expert modules whose weights an adapter is added to
    for module in model.modules():
        if type(module).__name__ == "ParamWrapper":
            once_a_step.update(id(m) for m in (*module.lora_A.values(), *module.lora_B.values()))
            adapted.add(id(module.get_base_layer()))
    for module in model.modules():
        weight = getattr(module, "weight", None)
        name = type(module).__name__
        if id(module) in once_a_step or hasattr(module, "base_layer"):
            continue  # peft's wrappers: their base layer and adapters are counted themselves
        if name.endswith("Experts"):
            experts = [p for p in module.parameters(recurse=False) if p.dim() == 3]
            if experts:
                active = getattr(config, "num_experts_per_tok", 0) or experts[0].shape[0]
                share = min(1.0, active / experts[0].shape[0])
                trained = id(module) in adapted or any(p.requires_grad for p in experts)
                yield module, share * sum(p.numel() for p in experts), trained
            continue
        if hasattr(module, "in_features") and hasattr(module, "out_features"):
            count = int(module.in_features) * int(module.out_features)
        elif weight is not None and weight.dim() == 2 and (name == "Conv1D" or name.endswith("Router")):
            count = int(weight.numel())
        else:
            continue
        yield module, float(count), bool(weight is not None and weight.requires_grad) or id(module) in adapted


def matmul_params(model: Any) -> tuple[int, int]:
    """(trained, frozen) weights a token is multiplied by: every linear layer's, adapters and active experts included."""
    trained = frozen = 0.0
    for _, count, is_trained in _matmul_modules(model):
        if is_trained:
            trained += count
        else:
            frozen += count
    return int(trained), int(frozen)


def token_flops(model: Any, context: float, rows_only: Iterable[torch.nn.Module] = ()) -> TokenFlops:
    """FLOPs per token, split by where they run (see the module doc). `rows_only`: the modules that
    last_layer_rows runs on the kept rows only."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else 0)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    output = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    in_head = {id(m) for m in output.modules()} if output is not None else set()
    in_rows = {id(m) for r in rows_only for m in r.modules()}
    every = head = rows = 0.0
    for module, count, trained in _matmul_modules(model):
        flops = (6.0 if trained else 4.0) * count
        if id(module) in in_head:
            head += flops
        elif id(module) in in_rows:
            rows += flops
        else:
            every += flops
    return TokenFlops(every + 12.0 * layers * heads * head_dim * context, head, rows)


def flops_per_token(model: Any, context: float) -> float:
    """A token's FLOPs with every position computed."""
    return token_flops(model, context).per_token


CPU_SIZE = 1536
"""The CPU's largest measuring matmul; a dtype it only emulates starts far smaller (see _cpu_operands)."""
CPU_BUDGET_S = 1.0
"""The CPU's trials stop after this long (two at least): a dtype the CPU emulates is slow to time."""


def _cpu_operands(dtype: torch.dtype, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest square operands up to CPU_SIZE whose product takes under 0.25 s here."""
    size = 256
    while True:
        a = torch.randn(size, size, dtype=dtype, generator=generator)
        b = torch.randn(size, size, dtype=dtype, generator=generator)
        began = time.perf_counter()
        a @ b
        bigger = min(2 * size, CPU_SIZE)
        if size >= CPU_SIZE or (time.perf_counter() - began) * (bigger / size) ** 3 > 0.25:
            return a, b
        size = bigger


def _measure(device: str, dtype: torch.dtype) -> float:
    """Best of several timed matmuls: a busy moment can only make one trial slower, never faster."""
    # Its own generator: the global random state is the run's (dropout, data order), and a peak
    # measured mid-run (a new thread count) must not move it.
    generator = torch.Generator(device=device).manual_seed(0)
    if device == "cuda":
        a = torch.randn(8192, 8192, device=device, dtype=dtype, generator=generator)
        b = torch.randn(8192, 8192, device=device, dtype=dtype, generator=generator)
        a @ b
    else:
        a, b = _cpu_operands(dtype, generator)
    size = a.shape[0]
    best, started = 0.0, time.perf_counter()
    for trial in range(8 if device == "cuda" else 6):
        if device != "cuda" and trial >= 2 and time.perf_counter() - started > CPU_BUDGET_S:
            break
        if device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2.0 * size**3 / (time.perf_counter() - began))
    if device == "cuda":
        # The three 8192^2 matrices (~400 MB in bf16) are the measurement's, not the run's: give
        # them back, and start the peak that the telemetry reports from here.
        del a, b
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return best


def forget_peak(device: str, dtype: torch.dtype) -> None:
    """Drop a cached peak that a run has beaten (it was measured on a busy machine)."""
    path = studio_home() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
        cache.pop(_key(device, dtype), None)
        path.write_text(json.dumps(cache, indent=1))
    except (OSError, json.JSONDecodeError):
        pass


def _key(device: str, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu-{torch.get_num_threads()}threads"
    return f"{name}|{dtype}|torch {torch.__version__}"


def peak_flops(device: str, dtype: torch.dtype) -> float:
    """Measured peak matmul FLOP/s for this device and dtype, cached per machine."""
    key = _key(device, dtype)
    path = studio_home() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = _measure(device, dtype)
        log.info("measured peak %.1f GFLOP/s for %s", cache[key] / 1e9, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=1))
        except OSError:
            pass  # a read-only home only costs a re-measurement next time
    return float(cache[key])
