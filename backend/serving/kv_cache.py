"""The KV cache of one model: bytes per token, what transformers' cache holds, what vLLM allocates.

A token costs 2 (K and V) x KV heads x head_dim x bytes in every attention layer; a sliding-window
layer stops growing at its window. MoE experts live in the MLP, so they add weights, never KV.
Torch-free: built from backend.estimate's Dims (config.json read the way the training estimate
reads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backend.estimate.architectures import Dims


@dataclass(frozen=True)
class KVLayout:
    """The attention layers that hold a cache: how many attend to everything, how many to a window."""

    full_layers: int
    sliding_layers: int
    window: int | None
    kv_heads: int
    head_dim: int
    value_bytes: int = 2
    """The cache's element size: vLLM's kv_cache_dtype auto keeps the model's 16-bit dtype."""

    @classmethod
    def of(cls, dims: Dims, value_bytes: int = 2, tensor_parallel: int = 1) -> "KVLayout":
        """The layout from config.json's numbers, per GPU under tensor parallelism (vLLM gives each
        GPU kv_heads / T heads, and replicates them when there are fewer KV heads than GPUs)."""
        sliding = sum(1 for kind in dims.layer_types if kind == "sliding_attention") if dims.sliding_window else 0
        kv_heads = max(1, dims.kv_heads // tensor_parallel)
        return cls(dims.layers - sliding, sliding, dims.sliding_window if sliding else None, kv_heads,
                   dims.head_dim, value_bytes)

    @property
    def layers(self) -> int:
        return self.full_layers + self.sliding_layers

    @property
    def layer_token_bytes(self) -> int:
        """One token in one layer: 2 x KV heads x head_dim x bytes."""
        return 2 * self.kv_heads * self.head_dim * self.value_bytes

    @property
    def token_bytes(self) -> int:
        """One token in every layer (2 x layers x KV heads x head_dim x bytes): the cost of each token
        while the sequence is shorter than the window, and of each token past it in full layers."""
        return self.layers * self.layer_token_bytes

    def held_tokens(self, tokens: int, sliding: bool) -> int:
        """Tokens transformers' DynamicCache keeps for one layer after a forward over `tokens`: all of
        them in a full layer; in a sliding layer (DynamicSlidingWindowLayer) the last window - 1."""
        if not sliding or self.window is None:
            return tokens
        return min(tokens, self.window - 1)

    def transformers_bytes(self, tokens: int, batch: int = 1) -> int:
        """Bytes of the K and V tensors transformers' cache returns after one forward over `tokens`."""
        held = (self.full_layers * self.held_tokens(tokens, False)
                + self.sliding_layers * self.held_tokens(tokens, True))
        return batch * held * self.layer_token_bytes

    def vllm_sequence_bytes(self, context: int, block_size: int, batched_tokens: int) -> int:
        """What vLLM must be able to give one sequence of `context` tokens (its KVCacheSpec's
        max_memory_usage_bytes): whole blocks in a full layer; in a sliding layer the last window - 1
        tokens plus one scheduled chunk (max_num_batched_tokens), plus one block because a window
        need not start at a block's edge. Counted per layer with the hybrid KV cache manager on."""
        page = block_size * self.layer_token_bytes
        full = math.ceil(context / block_size) * page
        sliding = 0
        if self.sliding_layers and self.window is not None:
            tokens = min(self.window - 1 + batched_tokens, context)
            sliding = (math.ceil(tokens / block_size) + 1) * page
        return self.full_layers * full + self.sliding_layers * sliding

    def describe(self) -> str:
        """One line: the per-token formula with this model's numbers."""
        text = (f"2 x {self.layers} layers x {self.kv_heads} KV heads x {self.head_dim} head_dim x "
                f"{self.value_bytes} B = {self.token_bytes:,} B per token")
        if self.sliding_layers:
            text += (f"; {self.sliding_layers} of the layers attend to a {self.window:,}-token window and stop "
                     f"growing there ({self.full_layers * self.layer_token_bytes:,} B per token beyond it)")
        return text
