"""Attention for packed rows without a block-diagonal mask: one causal SDPA call per example.

A packed row of eight short examples is one sequence of ~300 tokens to transformers' SDPA path,
which builds a (seq x seq) block-diagonal mask and attends over all of it: 8x the work that the
examples need, and a mask that rules out the fast causal kernel. FlashAttention-2 avoids this with
`cu_seq_lens` (varlen) on CUDA; this is the same idea for every other device. The packing collator
passes the example boundaries as transformers' own varlen keyword arguments (`cu_seq_lens_q/k`,
`max_length_q/k`), which the model hands down to the attention function untouched; when they are
present the row is cut at the boundaries and each example gets `is_causal=True` SDPA over itself
alone. Without them (padded batches, evaluation, generation) it is transformers' SDPA, unchanged.

Registered under its own name (`sdpa_packed`) through transformers' AttentionInterface, with the
SDPA mask function, so nothing in transformers is patched.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "sdpa_packed"


def register() -> str:
    """Make `sdpa_packed` loadable by `from_pretrained(attn_implementation=...)`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, packed_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """(batch, heads, seq, dim) in, (batch, seq, heads, dim) out, as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    bounds = kwargs.get("cu_seq_lens_q")
    if (bounds is None or query.shape[0] != 1 or query.shape[2] != key.shape[2]
            or getattr(kwargs.get("cu_seq_lens_k"), "shape", None) != bounds.shape):  # self-attention: k = q
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    cuts = _cuts(bounds)
    parts = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
            dropout_p=dropout, scale=scaling, is_causal=True)
        for start, end in zip(cuts[:-1], cuts[1:]) if end > start
    ]
    output = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return output.transpose(1, 2).contiguous(), None


_last: tuple[torch.Tensor | None, list[int]] = (None, [])


def _cuts(bounds: torch.Tensor) -> list[int]:
    """The boundaries as ints, read once per forward: every layer gets the same tensor, and on CUDA
    each read is a device sync."""
    global _last
    if _last[0] is not bounds:
        _last = (bounds, bounds.tolist())
    return _last[1]
