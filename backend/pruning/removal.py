"""Cut a loaded transformers model in place: whole layers, key/value head groups, FFN channels.

The model's config is updated with every cut, so `save_pretrained` writes a config.json that records
the new shapes (num_hidden_layers, layer_types, num_attention_heads, num_key_value_heads,
intermediate_size) and plain transformers loads the folder. Heads go as whole key/value groups, the
same number in every layer (one head count per config); channels the same number in every layer (one
intermediate_size). Layers are dropped last, so every index the user gave refers to the original model.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.pruning.importance import decoder_layers


def _linear(old: torch.nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> torch.nn.Linear:
    """A new Linear holding the kept output rows / input columns of `old`."""
    weight = old.weight.data
    bias = old.bias.data if old.bias is not None else None
    if rows is not None:
        weight = weight.index_select(0, rows.to(weight.device))
        bias = bias.index_select(0, rows.to(weight.device)) if bias is not None else None
    if cols is not None:
        weight = weight.index_select(1, cols.to(weight.device))
    new = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                          dtype=weight.dtype)
    new.weight.data.copy_(weight)
    if bias is not None:
        new.bias.data.copy_(bias)
    return new


def drop_head_groups(model: Any, drop: list[list[int]]) -> None:
    """Remove, per layer, the key/value groups listed (each layer the same number) and their query heads."""
    config = model.config
    heads, groups = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    per_group = heads // groups
    counts = {len(d) for d in drop}
    if len(counts) != 1 or counts == {0}:
        raise ValueError(f"every layer must lose the same number of key/value groups, got {sorted(counts)}")
    for layer, dropped in zip(decoder_layers(model), drop):
        attn = layer.self_attn
        dim = attn.head_dim
        keep_groups = [g for g in range(groups) if g not in set(dropped)]
        kv = torch.tensor([g * dim + d for g in keep_groups for d in range(dim)])
        q = torch.tensor([(g * per_group + h) * dim + d for g in keep_groups for h in range(per_group)
                          for d in range(dim)])
        attn.q_proj = _linear(attn.q_proj, rows=q)
        attn.k_proj = _linear(attn.k_proj, rows=kv)
        attn.v_proj = _linear(attn.v_proj, rows=kv)
        attn.o_proj = _linear(attn.o_proj, cols=q)
    left = groups - len(drop[0])
    if getattr(config, "head_dim", None) is None:
        config.head_dim = config.hidden_size // heads  # keep the per-head size once hidden/heads no longer gives it
    config.num_key_value_heads = left
    config.num_attention_heads = left * per_group


def keep_channels(model: Any, kept: list[torch.Tensor]) -> None:
    """Keep, per layer, the FFN channels listed (each layer the same number)."""
    sizes = {int(k.numel()) for k in kept}
    if len(sizes) != 1:
        raise ValueError(f"every layer must keep the same number of FFN channels, got {sorted(sizes)}")
    for layer, keep in zip(decoder_layers(model), kept):
        mlp = layer.mlp
        mlp.gate_proj = _linear(mlp.gate_proj, rows=keep)
        mlp.up_proj = _linear(mlp.up_proj, rows=keep)
        mlp.down_proj = _linear(mlp.down_proj, cols=keep)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = int(keep.numel())
    model.config.intermediate_size = int(kept[0].numel())


def drop_layers(model: Any, drop: list[int]) -> None:
    """Remove whole decoder layers; the rest keep their order, their layer_types entry (sliding or full
    attention) and are renumbered for the KV cache."""
    config = model.config
    decoder = model.get_decoder()
    keep = [i for i in range(len(decoder.layers)) if i not in set(drop)]
    if not keep:
        raise ValueError("dropping every layer leaves no model")
    decoder.layers = torch.nn.ModuleList([decoder.layers[i] for i in keep])
    for new_index, layer in enumerate(decoder.layers):
        for module in (layer, layer.self_attn):
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    types = getattr(config, "layer_types", None)
    if types:
        config.layer_types = [types[i] for i in keep]
    config.num_hidden_layers = len(keep)
    if getattr(config, "max_window_layers", None) is not None:  # Qwen2: layers past it use the window
        config.max_window_layers = sum(1 for i in keep if i < config.max_window_layers)


def parameter_count(model: Any) -> int:
    """Parameters of the model, tied embeddings counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
