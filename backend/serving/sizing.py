"""How many sequences, and how long a context, an export serves on a card: vLLM's memory split.

vLLM takes gpu_memory_utilization x the memory the card reports (torch.cuda.mem_get_info's total, in
bytes: a card sold as "24 GB" reports about 24 GiB), subtracts the weights, the peak of its start-up
profile run (a forward over max_num_batched_tokens dummy tokens and a sampler over max_num_seqs rows)
and what grew outside PyTorch meanwhile, and gives the rest to the KV cache in blocks. Here the same
split is predicted: the KV cache needs every sequence at its full context at once (no preemption).
What this leaves out, and which way that errs, is VLLM_GAPS. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from backend.estimate.architectures import Arch, Dims, all_linears
from backend.estimate.breakdown import GIB
from backend.estimate.estimator import CUBLAS_WORKSPACE_BYTES
from backend.serving.calibrated import WeightFiles
from backend.serving.kv_cache import KVLayout
from backend.serving.weights import Weights, weight_bytes

BLOCK_SIZE = 16
"""vLLM's default --block-size on CUDA: tokens per KV cache page."""
BATCHED_TOKENS = 2048
"""--max-num-batched-tokens printed on the line (vLLM's default depends on the GPU and the entry
point, so the line states it): the profile run's token count, and the chunk a prefill is cut into."""
SAMPLER_BYTES_PER_LOGIT = 2 + 3 * 4
"""Per row and vocabulary entry in the profile's sampler: the 16-bit logits, then an fp32 copy,
probabilities and log-probabilities (an assumption: vLLM measures this part, it does not state it)."""
UTILIZATION = 0.9
"""vLLM's default gpu_memory_utilization."""
VLLM_GAPS = (
    "CUDA graphs are not counted, so on a vLLM that takes its estimate of their memory out of the KV cache "
    "before sizing it (recent releases, as their memory profiling is described; not checked here against a "
    "release, nor measured) the KV cache is smaller than this by that estimate, which vLLM logs at start-up "
    "(--enforce-eager captures none); the CUDA context is left out on purpose: vLLM counts what grew after "
    "it was made")
"""Which way the estimate errs against vLLM's own arithmetic, said under every estimate (docs/benchmarks.md)."""


@dataclass(frozen=True)
class Card:
    """The card (per GPU) and the server's settings that decide memory."""

    gb: float
    utilization: float = UTILIZATION
    tensor_parallel: int = 1
    block_size: int = BLOCK_SIZE
    batched_tokens: int = BATCHED_TOKENS

    @property
    def budget(self) -> int:
        """Bytes vLLM may use: gpu_memory_utilization x the card, `gb` taken in GiB as the card reports
        its total (vLLM's requested memory)."""
        return int(self.gb * GIB * self.utilization)


@dataclass
class ServePlan:
    """The figures behind one vLLM line, per GPU."""

    weights: int
    activations: int
    runtime: int
    kv_per_token: int
    kv_per_sequence: int
    context: int
    max_num_seqs: int
    budget: int
    kv_budget: int
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def activation_bytes(arch: Arch, dims: Dims, card: Card, seqs: int) -> int:
    """The peak of vLLM's profile run above the weights, on one GPU: one layer's live tensors over
    max_num_batched_tokens tokens (residual, its norm, then the larger of attention's q, k, v and
    output or the MLP's gate-up and activation output; MoE: each token's top-k experts), plus the
    sampler's rows (one per sequence, at most one per scheduled token)."""
    t, tp = card.batched_tokens, card.tensor_parallel
    attention = (2 * dims.q_dim + 2 * dims.kv_dim) // tp
    dense = 3 * dims.intermediate if dims.layers > dims.moe_layers else 0
    # A MoE layer: each token's top-k experts' gate-up and activation output, their outputs, a shared expert.
    moe = 3 * (dims.expert_intermediate * dims.top_k + dims.shared_intermediate) + dims.hidden if dims.moe_layers else 0
    mlp = max(dense, moe) // tp
    forward = t * 2 * (2 * dims.hidden + max(attention, mlp))
    rows = min(seqs, t)
    return forward + rows * math.ceil(dims.vocab / tp) * SAMPLER_BYTES_PER_LOGIT


def lora_slot_bytes(arch: Arch, dims: Dims, rank: int, tensor_parallel: int = 1) -> int:
    """What --enable-lora adds on the GPU: vLLM wraps every decoder linear and preallocates A and B at
    --max-lora-rank for --max-loras adapters (1 by default), 16-bit, whatever the adapter targets."""
    per_rank = sum((lin.inp + lin.out) * count for lin, count in all_linears(arch, dims))
    return -(-2 * rank * per_rank // tensor_parallel)


def runtime_bytes() -> int:
    """Memory outside the KV cache and the profile's tensors that vLLM's budget holds: the cuBLAS workspace
    its profile run's first matmul allocates (as the training estimate counts it). Not the CUDA context:
    vLLM's profiling counts what grew after the context was made, so the context lies outside the budget."""
    return CUBLAS_WORKSPACE_BYTES


class Sizing:
    """One model, one format, one card: solves for sequences at a context and context at a count."""

    def __init__(self, arch: Arch, dims: Dims, fmt: str, card: Card, max_positions: int, lora_rank: int = 0,
                 files: WeightFiles | None = None) -> None:
        if dims.heads % card.tensor_parallel:
            raise ValueError(f"--tensor-parallel {card.tensor_parallel}: vLLM splits the {dims.heads} attention "
                             "heads evenly over the GPUs; pick a count that divides them")
        self.arch, self.dims, self.card, self.max_positions = arch, dims, card, max_positions
        weights = weight_bytes(arch, dims, fmt, card.tensor_parallel, files)
        if lora_rank:
            slot = lora_slot_bytes(arch, dims, lora_rank, card.tensor_parallel)
            weights = Weights(weights.bytes + slot, weights.params,
                              weights.how + f"; + one LoRA slot of rank {lora_rank}, {slot / 2**20:.1f} MiB")
        self.weights: Weights = weights
        self.kv = KVLayout.of(dims, tensor_parallel=card.tensor_parallel)
        self.runtime = runtime_bytes()

    def _spare(self, seqs: int) -> int:
        """Bytes left for the KV cache with `seqs` sequences' sampler rows in the profile."""
        return (self.card.budget - self.weights.bytes - self.runtime
                - activation_bytes(self.arch, self.dims, self.card, seqs))

    def sequence_bytes(self, context: int) -> int:
        return self.kv.vllm_sequence_bytes(context, self.card.block_size, self.card.batched_tokens)

    def _fits(self, seqs: int, context: int) -> bool:
        return seqs * self.sequence_bytes(context) <= self._spare(seqs)

    def seqs_at(self, context: int) -> ServePlan:
        """The most sequences that hold `context` tokens each at once; capped at
        max_num_batched_tokens, the most a decode step can advance together."""
        low, high = 0, self.card.batched_tokens
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._fits(mid, context) else (low, mid - 1)
        notes = [] if low < self.card.batched_tokens else [
            f"capped at --max-num-batched-tokens {self.card.batched_tokens}: a decode step advances at most "
            "that many sequences; the KV cache would hold more"]
        return self._plan(context, low, notes)

    def context_at(self, seqs: int) -> ServePlan:
        """The longest context `seqs` sequences can each hold at once, at most the model's positions."""
        low, high = 0, self.max_positions
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._fits(seqs, mid) else (low, mid - 1)
        notes = [] if low < self.max_positions else [
            f"capped at the model's {self.max_positions:,} positions (max_position_embeddings)"]
        return self._plan(low, seqs, notes)

    def _plan(self, context: int, seqs: int, notes: list[str]) -> ServePlan:
        seqs_for_profile = max(seqs, 1)
        return ServePlan(weights=self.weights.bytes, runtime=self.runtime, kv_per_token=self.kv.token_bytes,
                         activations=activation_bytes(self.arch, self.dims, self.card, seqs_for_profile),
                         kv_per_sequence=self.sequence_bytes(context) if context else 0, context=context,
                         max_num_seqs=seqs, budget=self.card.budget, kv_budget=max(0, self._spare(seqs_for_profile)),
                         notes=notes)

    def does_not_fit(self) -> str:
        """Why nothing fits ("" when one sequence of one block does): the weights alone, or with the rest."""
        if self._fits(1, self.card.block_size):
            return ""
        need = self.weights.bytes + self.runtime + activation_bytes(self.arch, self.dims, self.card, 1)
        return (f"the weights ({self.weights.bytes / GIB:.2f} GiB) with the runtime and the profile run need "
                f"{need / GIB:.2f} GiB, more than {self.card.utilization:g} x {self.card.gb:g} GiB "
                f"= {self.card.budget / GIB:.2f} GiB; pick a smaller format (--format gptq-int4, awq-int4, bnb-4bit, gguf-q4_0), "
                "a larger card, or --tensor-parallel")


def vllm_command(path: str, plan: ServePlan, card: Card, extra: list[str] | None = None) -> str:
    """The `vllm serve` line these numbers imply (printed, never run)."""
    parts = ["vllm", "serve", _quote(path), "--max-model-len", str(plan.context), "--max-num-seqs",
             str(plan.max_num_seqs), "--gpu-memory-utilization", f"{card.utilization:g}", "--block-size",
             str(card.block_size), "--max-num-batched-tokens", str(card.batched_tokens),
             "--tensor-parallel-size", str(card.tensor_parallel)]
    return " ".join(parts + list(extra or []))


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
