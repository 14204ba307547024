"""Attention for packed rows without a block-diagonal mask: one causal SDPA call per example.

A packed row of eight short examples is one sequence of ~300 tokens to transformers' SDPA path,
which builds a (seq x seq) block-diagonal mask and attends over all of it: 8x the work that the
examples need, a mask that rules out the fast causal kernels, and (with packing's long rows on a
GPU) hundreds of MB of mask that activation checkpointing keeps for every layer. FlashAttention-2
avoids all of this with `cu_seq_lens` (varlen) on CUDA; this is the same idea for every other device.

The example boundaries come from the packing collator as transformers' own varlen arguments
(`cu_seq_lens_q/k`), which the model hands down to the attention function untouched, or failing
that from the restarting position ids (which the decoder layers also hand down). For a single row
without padding the mask function builds no mask at all, and the attention function cuts the row
at the boundaries and gives each example `is_causal=True` SDPA over itself alone. Anything else
(padded batches, several rows, a KV cache) is transformers' SDPA with its usual mask, unchanged.

Registered under its own name (`sdpa_packed`) through transformers' AttentionInterface and
AttentionMaskInterface, so nothing in transformers is patched.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "sdpa_packed"


def register() -> str:
    """Make `sdpa_packed` loadable by `from_pretrained(attn_implementation=...)`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, packed_sdpa_attention)
    AttentionMaskInterface.register(NAME, packed_sdpa_mask)
    return NAME


def packed_sdpa_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """No mask for one unpadded row of plain causal attention (causal per example is the attention
    function's job); SDPA's own mask for everything else, sliding windows and chunks included."""
    from transformers.masking_utils import sdpa_mask

    config = kwargs.get("config")
    windowed = any(getattr(config, name, None) for name in ("sliding_window", "attention_chunk_size"))
    if (not args and not windowed and kwargs.get("local_size") is None and kwargs.get("batch_size") == 1
            and kwargs.get("attention_mask") is None and kwargs.get("q_length") == kwargs.get("kv_length")
            and not kwargs.get("q_offset") and not kwargs.get("kv_offset")
            and not kwargs.get("use_vmap")):  # vmap: the model added its own mask rules (images, blocks)
        return None
    return sdpa_mask(*args, **kwargs)


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """(batch, heads, seq, dim) in, (batch, seq, heads, dim) out, as transformers' attention functions do."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward, use_gqa_in_sdpa

    length = query.shape[2]
    cuts = None
    if attention_mask is None and query.shape[0] == 1 and key.shape[2] == length and length > 1:
        cuts = _example_bounds(kwargs, length)
    if cuts is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    gqa = groups > 1 and use_gqa_in_sdpa(None, key, value)
    if groups > 1 and not gqa:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    # split, not slices: its backward is one cat, where each slice's backward writes a zero tensor
    # of the whole row (3.2 -> 1.3 ms per layer with GQA on the preset's row, 1 CPU thread).
    sizes = [end - start for start, end in zip(cuts[:-1], cuts[1:])]
    parts = [
        torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True,
                                                         enable_gqa=gqa)
        for q, k, v in zip(query.split(sizes, 2), key.split(sizes, 2), value.split(sizes, 2)) if q.shape[2]
    ]
    output = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return output.transpose(1, 2).contiguous(), None


_last: tuple[Any, list[int] | None] = (None, None)


def _example_bounds(kwargs: dict[str, Any], length: int) -> list[int] | None:
    """[0, end of example 1, ..., length], read once per forward (every layer gets the same tensors,
    and on CUDA each read is a device sync); None when neither source is there or they do not fit."""
    global _last
    source = kwargs.get("cu_seq_lens_q")
    if source is None:
        source = kwargs.get("position_ids")
    if source is None:
        return None
    if _last[0] is not source:
        _last = (source, _read_bounds(source, kwargs.get("cu_seq_lens_q") is source))
    cuts = _last[1]
    return cuts if cuts and cuts[0] == 0 and cuts[-1] == length else None


def _read_bounds(source: torch.Tensor, cumulative: bool) -> list[int] | None:
    if cumulative:
        return source.tolist()
    positions = source.reshape(-1) if source.dim() == 1 or source.shape[0] == 1 else None
    if positions is None:
        return None
    # An example starts wherever the positions do not continue the previous one (a reset to 0).
    starts = torch.nonzero(positions[1:] != positions[:-1] + 1).reshape(-1) + 1
    return [0, *starts.tolist(), positions.numel()]
