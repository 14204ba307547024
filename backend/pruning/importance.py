"""Importance of layers, key/value head groups and FFN channels, measured on calibration rows.

Layers: Block Influence (ShortGPT, Men et al. 2024): 1 - the mean cosine similarity of a layer's input
and output hidden states over real tokens; a layer that barely turns its input is the cheapest to drop.
Heads: the mean L2 norm of each query head's contribution to the residual stream (its slice of the
o_proj input times its columns of o_proj), summed over the heads that share a key/value head.
FFN channels: the L2 norm of a channel's activation (the down_proj input) over tokens times the L2
norm of its down_proj column: how much that channel writes into the residual stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from backend.training.tokenized import PadCollator

LAYER_HOW = "Block Influence: 1 - mean cos(input, output) of the layer's hidden states over the calibration tokens"
HEAD_HOW = ("mean over tokens of ||head output @ its o_proj columns||, summed over the query heads of each "
            "key/value group")
FFN_HOW = "||activation into down_proj|| over tokens x ||down_proj column|| per channel"


def decoder_layers(model: Any) -> Any:
    """The ModuleList of decoder layers (model.model.layers for every supported family)."""
    return model.get_decoder().layers


@dataclass
class Ranking:
    """Scores per layer, per (layer, key/value group) and per (layer, channel); higher = more important."""

    layers: list[float]
    groups: list[list[float]]  # [layer][group]
    channels: list[torch.Tensor]  # [layer] -> (intermediate,)
    tokens: int
    rows: int
    layer_types: list[str]

    def least_layers(self, n: int) -> list[int]:
        return sorted(range(len(self.layers)), key=lambda i: self.layers[i])[:n]

    def least_groups(self, n: int) -> list[list[int]]:
        return [sorted(range(len(g)), key=lambda j: g[j])[:n] for g in self.groups]

    def kept_channels(self, keep: int) -> list[torch.Tensor]:
        """Per layer the indices of the `keep` strongest channels, in their original order."""
        return [torch.sort(torch.topk(c, keep).indices).values for c in self.channels]

    def to_json(self) -> dict[str, Any]:
        order = sorted(range(len(self.layers)), key=lambda i: self.layers[i])
        return {
            "calibration": {"rows": self.rows, "tokens": self.tokens},
            "layers": {"how": LAYER_HOW, "least_important_first": order,
                       "scores": [{"layer": i, "score": round(self.layers[i], 6),
                                   **({"layer_type": self.layer_types[i]} if self.layer_types else {})}
                                  for i in range(len(self.layers))]},
            "heads": {"how": HEAD_HOW, "unit": "key/value group",
                      "scores": [[round(s, 6) for s in g] for g in self.groups],
                      "least_important_first": self.least_groups(len(self.groups[0]) if self.groups else 0)},
            "ffn": {"how": FFN_HOW, "intermediate_size": int(self.channels[0].numel()) if self.channels else 0,
                    "per_layer": [_channel_summary(c) for c in self.channels]},
        }


def _channel_summary(scores: torch.Tensor) -> dict[str, float]:
    """A layer's channel scores in a few figures: share of the total score in the weakest quarter, etc."""
    ordered = torch.sort(scores.float()).values
    total = float(ordered.sum()) or 1.0
    quarter = max(1, ordered.numel() // 4)
    return {"min": round(float(ordered[0]), 6), "median": round(float(ordered[ordered.numel() // 2]), 6),
            "max": round(float(ordered[-1]), 6), "weakest_quarter_share": round(float(ordered[:quarter].sum()) / total, 6)}


@torch.no_grad()
def rank(model: Any, rows: Any, pad_id: int, batch_size: int,
         on_batch: Callable[[int, int], None] = lambda done, total: None) -> Ranking:
    """Run the calibration rows ({input_ids, ...}) through `model` with hooks that accumulate the scores."""
    layers = decoder_layers(model)
    config = model.config
    heads = config.num_attention_heads
    groups = getattr(config, "num_key_value_heads", None) or heads
    per_group = heads // groups
    n = len(layers)
    cos_sum = [0.0] * n
    head_sum = [torch.zeros(heads, dtype=torch.float64) for _ in range(n)]
    chan_sq = [None] * n
    state: dict[str, Any] = {"mask": None, "tokens": 0}
    handles = []

    def hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]

    def layer_hook(i: int):
        def hook(module, args, kwargs, output):
            x = hidden_of(args, kwargs).float()
            y = (output[0] if isinstance(output, tuple) else output).float()
            cos = torch.nn.functional.cosine_similarity(x, y, dim=-1)  # (B, T)
            cos_sum[i] += float(cos[state["mask"]].sum())
        return hook

    def o_proj_hook(i: int, weight: torch.Tensor):
        def hook(module, args):
            x = args[0].float()[state["mask"]]  # (tokens, heads * head_dim)
            dim = x.shape[-1] // heads
            w = weight.float()
            for h in range(heads):
                part = x[:, h * dim:(h + 1) * dim] @ w[:, h * dim:(h + 1) * dim].T
                head_sum[i][h] += float(part.norm(dim=-1).sum())
        return hook

    def down_hook(i: int):
        def hook(module, args):
            a = args[0].float()[state["mask"]]
            sq = (a * a).sum(dim=0).double().cpu()
            chan_sq[i] = sq if chan_sq[i] is None else chan_sq[i] + sq
        return hook

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(layer_hook(i), with_kwargs=True))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(o_proj_hook(i, layer.self_attn.o_proj.weight)))
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(down_hook(i)))
    collate = PadCollator(pad_id)
    device = next(model.parameters()).device
    total = max(1, math.ceil(len(rows) / batch_size))
    try:
        for k, start in enumerate(range(0, len(rows), batch_size), start=1):
            batch = collate([{"input_ids": rows[j]["input_ids"], "labels": rows[j]["input_ids"]}
                             for j in range(start, min(start + batch_size, len(rows)))])
            mask = batch["attention_mask"].bool().to(device)
            state["mask"] = mask
            state["tokens"] += int(mask.sum())
            model(input_ids=batch["input_ids"].to(device), attention_mask=mask.long(), use_cache=False)
            on_batch(k, total)
    finally:
        for handle in handles:
            handle.remove()
    tokens = max(state["tokens"], 1)
    group_scores = [[float(head_sum[i][g * per_group:(g + 1) * per_group].sum()) / tokens for g in range(groups)]
                    for i in range(n)]
    channels = [chan_sq[i].sqrt().float() * layers[i].mlp.down_proj.weight.float().norm(dim=0).cpu() / math.sqrt(tokens)
                for i in range(n)]
    return Ranking(layers=[1.0 - c / tokens for c in cos_sum], groups=group_scores, channels=channels,
                   tokens=state["tokens"], rows=len(rows), layer_types=list(getattr(config, "layer_types", None) or []))
