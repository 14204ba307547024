"""Where a calibrated export acts in a model: its decoder layers' linear layers, and for the scaling
algorithms (AWQ, SmoothQuant) which norm or linear layer feeds which linear layers.

A per-input-channel scale s can be folded into a model without changing what it computes only where the
layer feeding those channels can absorb 1/s: a norm's weight (Gemma's norms multiply by 1 + weight),
or the rows of up_proj, whose output reaches down_proj through an elementwise product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from backend.core.registries.export_formats import group_size_for

ATTENTION_INPUTS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.qkv_proj",))
MLP_INPUTS = (("mlp.gate_proj", "mlp.up_proj"), ("mlp.gate_up_proj",))


@dataclass
class Mapping:
    """`linears` all read the output of `feeder` (a norm, or up_proj for down_proj)."""

    name: str
    feeder: nn.Module
    linears: list[nn.Linear]
    plus_one: bool = False  # the feeder is a Gemma norm: it multiplies by (1 + weight)

    def fold(self, scale: torch.Tensor) -> None:
        """Divide the feeder's output channels by `scale` and multiply the linears' input columns by it."""
        with torch.no_grad():
            weight = self.feeder.weight
            s = scale.to(weight.device, torch.float32)
            if isinstance(self.feeder, nn.Linear):  # a fused qkv_proj or gate_up_proj: only its last rows feed
                rows = weight.float()
                rows[-s.shape[0]:] /= s[:, None]
                rewrite(self.feeder, "weight", rows)
            elif self.plus_one:
                rewrite(self.feeder, "weight", (1.0 + weight.float()) / s - 1.0)
            else:
                rewrite(self.feeder, "weight", weight.float() / s)
            bias = getattr(self.feeder, "bias", None)
            if bias is not None:
                shifted = bias.float()
                shifted[-s.shape[0]:] /= s
                rewrite(self.feeder, "bias", shifted)
            for linear in self.linears:  # a band of rows at a time: fp32 scratch of a band, not of the weight
                weight = linear.weight
                scaled = torch.empty_like(weight)
                for begin, end in row_bands(weight):
                    scaled[begin:end] = weight[begin:end].float() * s.to(weight.device)
                rewrite(linear, "weight", scaled)


BAND = 1 << 22
"""Weight entries per band of rows in the row-wise steps (16 MB in fp32) that write a new weight (a fold, AWQ's
candidates and clipping): their fp32 temporaries are a band's, where the whole weight's were several
weight-sized fp32 copies (0.4x the 16-bit size of a 2-layer TinyLlama-wide model in AWQ's search)."""


def row_bands(weight: torch.Tensor) -> list[tuple[int, int]]:
    """(begin, end) rows of about BAND entries: a step done by bands must work on each row alone."""
    step = max(1, BAND // max(weight.shape[1], 1))
    return [(begin, min(begin + step, weight.shape[0])) for begin in range(0, weight.shape[0], step)]


def rewrite(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Set a parameter to new memory holding `value` (in the parameter's dtype) rather than writing into it: a
    loaded weight is a view of the checkpoint file's private mapping, whose written pages would stay resident
    until the whole file is freed, so packing the layer later could not hand them back."""
    old = getattr(module, name)
    setattr(module, name, nn.Parameter(value.to(old.dtype), requires_grad=False))


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(name, modules) of the model's stack of decoder layers: the first ModuleList of blocks holding Linears
    inside its decoder (transformers' `get_decoder`: a vision-language model's language model, whose vision
    tower comes first among its modules)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    inside = next((name for name, module in model.named_modules() if module is decoder), "")
    for name, module in decoder.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and any(
                isinstance(m, nn.Linear) for m in module[0].modules()):
            return ".".join(part for part in (inside, name) if part), module
    raise ValueError("no stack of decoder layers with nn.Linear layers found")


def quantized_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """Every nn.Linear inside the decoder layers (the embeddings and lm_head stay 16-bit), by full name."""
    prefix, _ = decoder_layers(model)
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.startswith(prefix + ".")}


def get_module(layer: nn.Module, path: str) -> nn.Module | None:
    try:
        return layer.get_submodule(path)
    except AttributeError:
        return None


def _first_present(layer: nn.Module, options: tuple[tuple[str, ...], ...]) -> list[nn.Linear]:
    for names in options:
        found = [get_module(layer, n) for n in names]
        if all(isinstance(m, nn.Linear) for m in found):
            return found  # type: ignore[return-value]
    return []


def mappings(model: nn.Module, with_up_down: bool) -> list[Mapping]:
    """The foldable (feeder -> linears) pairs of every decoder layer, in the order the layers run."""
    prefix, layers = decoder_layers(model)
    found: list[Mapping] = []
    for index, layer in enumerate(layers):
        where = f"{prefix}.{index}"
        found += mappings_of(layer, where)
        up, down, gate = get_module(layer, "mlp.up_proj"), get_module(layer, "mlp.down_proj"), get_module(layer, "mlp.gate_proj")
        if with_up_down and isinstance(up, nn.Linear) and isinstance(down, nn.Linear) and isinstance(gate, nn.Linear):
            found.append(Mapping(f"{where} up->down", up, [down]))
    return found


def mappings_of(layer: nn.Module, where: str) -> list[Mapping]:
    """One decoder layer's norm mappings: its attention norm -> q/k/v ("WHERE attention"), its MLP norm -> gate/up
    ("WHERE mlp"), each where the layer has them."""
    found = []
    attention_norm = get_module(layer, "input_layernorm")
    mlp_norm = get_module(layer, "pre_feedforward_layernorm") or get_module(layer, "post_attention_layernorm")
    for norm, linears, what in ((attention_norm, _first_present(layer, ATTENTION_INPUTS), "attention"),
                                (mlp_norm, _first_present(layer, MLP_INPUTS), "mlp")):
        if norm is not None and getattr(norm, "weight", None) is not None and linears:
            plus_one = type(norm).__name__.startswith("Gemma")
            found.append(Mapping(f"{where} {what}", norm, linears, plus_one))
    return found


def group_size(linears: dict[str, nn.Linear]) -> int:
    """The 4-bit group size for these layers (export_formats.group_size_for: the rule the serving estimate uses)."""
    widths = sorted({m.in_features for m in linears.values()})
    size = group_size_for(widths)
    if size is None:
        raise ValueError(f"input widths {widths} are not all multiples of 32, which 4-bit groups need")
    return size
