"""AWQ (Lin et al., 2023) as llmcompressor 0.14's AWQModifier runs it, then AutoAWQ's clipping search.

Per mapping (a norm or linear layer feeding some linear layers), a per-input-channel scale s is searched on
a grid of 20: duo scaling s = mean|X|^r / (mean|W~|^(1-r) + 1e-4), W~ each weight group divided by its
largest magnitude, normalised by sqrt(max(s) min(s)), plus the identity (r = 0 without the weights). Each
candidate is judged by the output of the mapping's parent module (self_attn for q/k/v, the mlp for
gate/up, the linear itself for o_proj and down_proj), run again on the calibration calls it received with
the mapping's linears fake-quantized as Q(W s) / s; the best is folded in (layers.Mapping.fold). Then
AutoAWQ's clipping search (auto_clip, MIT) shrinks each group's range [-m, m] in 10 steps of 5% where the
layer's rounded output on 512 tokens moves least (never q_proj or k_proj, whose errors the q.k product
multiplies). The groups are asymmetric (compressed-tensors' W4A16_ASYM), as llmcompressor's AWQ preset.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from backend.export.calibrated import layers
from backend.export.calibrated.grid import fake_quantize, weight_qparams
from backend.export.memory import trim_heap
from backend.export.verify import cpu_products_in_fp32

GRID = 20
"""llmcompressor's n_grid: with duo scaling, the identity then 19 ratios r = i / 18 of the duo formula."""
TOKENS = {"cpu": 1024, "cuda": 4096}
"""Positions of whole calibration calls each mapping keeps to judge its candidates, by device: llmcompressor
keeps every call, but each mapping runs its parent 20 times over them, which dominates a CPU export (2048
positions made the write stage 4x main's on a 2-layer TinyLlama-wide model: docs/benchmarks.md)."""
CLIP_CHUNK = 1 << 22
"""Output rows x tokens x groups per step of the clipping search (16 MB of fp32): AutoAWQ takes 64 or 256
rows at a time for the same reason; the whole weight at once peaked at 3x the model's 16-bit size."""
MASK_BYTES = 512 * 4
"""Per kept position, a bound on the attention mask an attention parent's call holds (rows of at most 512
tokens: samples.MAX_TOKENS, a 4-D mask of up to 4-byte entries); the hidden states take 2 bytes a channel."""
CLIP_GRID, CLIP_SHRINK, CLIP_TOKENS = 20, 0.5, 512
"""AutoAWQ's _compute_best_clip defaults: max_val = (1 - i / 20) x the group's max for i < 10, on <= 512 tokens."""
NO_CLIP = ("q_", "k_", "query", "key", "Wqkv")
"""AutoAWQ's avoid_clipping: names whose rounding error the q.k product multiplies."""


@dataclass
class AwqMapping:
    """A foldable mapping and the module whose output judges its scales."""

    mapping: layers.Mapping
    parent: nn.Module
    names: list[str]  # the linears' names inside their decoder layer ("self_attn.q_proj", for NO_CLIP)

    @property
    def parent_device(self) -> str:
        return self.mapping.linears[0].weight.device.type


def grid_points(n_grid: int = GRID) -> list[tuple[float, bool]]:
    """(ratio, duo) pairs: llmcompressor's duo_scaling=True, the identity first so it is always a candidate."""
    return [(0.0, False)] + [(i / (n_grid - 2), True) for i in range(n_grid - 1)]


def weight_means(linears: list[nn.Linear], group: int | None) -> torch.Tensor:
    """Mean over all output rows of |W| / max|W| of its group (or row), per input channel (duo scaling's w_mean).
    The normalised rows are made a band at a time into one fp32 buffer, which is then summed whole: the same
    sum as over one weight-sized expression, with one fp32 copy of the weight where that held three."""
    total, rows = None, 0
    for linear in linears:
        weight = linear.weight.detach()
        chunk = group or weight.shape[1]
        normed = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        for begin, end in layers.row_bands(weight):
            band = weight[begin:end].float().reshape(-1, chunk).abs()
            normed[begin:end] = (band / (band.amax(dim=1, keepdim=True) + 1e-6)).reshape(end - begin, -1)
        sums = normed.sum(0, dtype=torch.float64)
        del normed
        total = sums if total is None else total + sums
        rows += weight.shape[0]
    return (total / rows).float()


def candidate(x_mean: torch.Tensor, w_mean: torch.Tensor | None, ratio: float, duo: bool) -> torch.Tensor:
    """One grid point's scales, normalised as llmcompressor does (inf and nan to 1)."""
    if duo:
        scales = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
    else:
        scales = x_mean.pow(ratio).clamp(min=1e-4).view(-1)
    scales = scales / (scales.max() * scales.min()).sqrt()
    scales[torch.isinf(scales)] = 1
    scales[torch.isnan(scales)] = 1
    return scales


def quantized_scaled(weight: torch.Tensor, scales: torch.Tensor, args: Any, scale_dtype: torch.dtype) -> torch.Tensor:
    """Q(W s) / s in the weight's dtype: W s rounded to that dtype first, as llmcompressor writes it into the layer.
    A band of rows at a time (each row's groups are its own), into one buffer of the weight's dtype."""
    out = torch.empty_like(weight)
    for begin, end in layers.row_bands(weight):
        scaled = (weight[begin:end].float() * scales[None, :]).to(weight.dtype)
        scale, zero = weight_qparams(scaled, args, scale_dtype)
        out[begin:end] = (fake_quantize(scaled, scale, args, zero) / scales[None, :]).to(weight.dtype)
    return out


@torch.no_grad()
def search_scale(parent: nn.Module, calls: list[tuple[tuple, dict]], linears: list[nn.Linear],
                 x_mean: torch.Tensor, args: Any, scale_dtype: torch.dtype,
                 points: list[tuple[float, bool]] | None = None) -> torch.Tensor:
    """The grid point whose fake-quantized linears give the parent's outputs on `calls` the least mean squared
    error (llmcompressor's _compute_best_scale); the linears' weights are left as they were."""
    originals = [linear.weight.data for linear in linears]
    w_mean = weight_means(linears, args.group_size)
    expected = [_output(parent, call) for call in calls]
    best, best_error = None, float("inf")
    try:
        for ratio, duo in points or grid_points():
            scales = candidate(x_mean, w_mean, ratio, duo)
            for linear, original in zip(linears, originals):
                linear.weight.data = quantized_scaled(original, scales.to(original.device), args, scale_dtype)
            total, count = 0.0, 0
            for call, reference in zip(calls, expected):
                out = _output(parent, call)
                total += float(torch.nn.functional.mse_loss(reference.float(), out.float(), reduction="sum"))
                count += reference.numel()
            error = total / max(count, 1)
            if error < best_error:
                best, best_error = scales.clone(), error
            trim_heap()  # the candidate's bands and the parent's outputs: freed blocks the heap would keep
    finally:
        for linear, original in zip(linears, originals):
            linear.weight.data = original
    if best is None:
        raise ValueError("AWQ found no finite loss: the parent module's outputs hold nan or inf")
    return best


@torch.no_grad()
def best_clip(weight: torch.Tensor, x: torch.Tensor, args: Any, scale_dtype: torch.dtype) -> torch.Tensor:
    """(rows, groups) largest magnitudes to keep: AutoAWQ's _compute_best_clip, each (row, group) shrunk to the
    step whose rounded partial products over the group's inputs move least (einsum in place of its broadcast)."""
    rows, columns = weight.shape
    group = args.group_size or columns
    x = x.reshape(-1, columns)
    x = x[::max(1, x.shape[0] // CLIP_TOKENS)].float().reshape(-1, columns // group, group)  # tokens, groups, group
    step = max(1, CLIP_CHUNK // (x.shape[0] * x.shape[1]))
    if args.group_size and rows > step:  # each row's groups are searched alone: the same result a chunk at a time
        limits = []
        for i in range(0, rows, step):
            limits.append(best_clip(weight[i:i + step], x.reshape(x.shape[0], -1), args, scale_dtype))
            trim_heap()  # a chunk's 16 MB products come from glibc's heap, which otherwise grows chunk by chunk
        return torch.cat(limits)
    w = weight.float().reshape(rows, columns // group, group)
    original_max = w.abs().amax(dim=-1, keepdim=True)  # rows, groups, 1
    best_max = original_max.clone()
    least = torch.full_like(original_max, 1e9)
    reference = torch.einsum("tgk,rgk->rtg", x, w)
    for step in range(int(CLIP_SHRINK * CLIP_GRID)):
        max_val = original_max * (1 - step / CLIP_GRID)
        clipped = torch.clamp(w, -max_val, max_val).reshape(rows, columns)
        scale, zero = weight_qparams(clipped, args, scale_dtype)
        rounded = fake_quantize(clipped, scale, args, zero).reshape(rows, columns // group, group)
        error = (torch.einsum("tgk,rgk->rtg", x, rounded) - reference).pow(2).mean(dim=1).unsqueeze(-1)
        better = error < least
        least[better] = error[better]
        best_max[better] = max_val[better]
    return best_max.squeeze(-1)


def clip(linear: nn.Linear, x: torch.Tensor, args: Any, scale_dtype: torch.dtype) -> None:
    """AutoAWQ's apply_clip: the weight clamped to each (row, group)'s searched [-m, m] (a band of rows at a time)."""
    weight = linear.weight.detach()
    group = args.group_size or weight.shape[1]
    limit = best_clip(weight, x, args, scale_dtype)[:, :, None]
    clamped = torch.empty_like(weight)
    for begin, end in layers.row_bands(weight):
        w = weight[begin:end].float().reshape(end - begin, -1, group)
        clamped[begin:end] = torch.clamp(w, -limit[begin:end], limit[begin:end]).reshape(end - begin, -1)
    layers.rewrite(linear, "weight", clamped)


def _products_in_fp32(parent: nn.Module) -> contextlib.AbstractContextManager:
    """verify.cpu_products_in_fp32 on the parent, unless a pipeline that finishes units inside its own already
    patched these layers (a nested one would take the outer one's patch away on leaving)."""
    patched = any("forward" in vars(m) for m in parent.modules() if isinstance(m, nn.Linear))
    return contextlib.nullcontext() if patched else cpu_products_in_fp32(parent)


def _split_call(module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor, dict]:
    """(the first argument, every other one by name) of a call, however the caller passed them (llmcompressor
    binds the call to forward's signature the same way), so it can be replayed as module(x, **rest)."""
    bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    bound |= bound.pop("kwargs", {})
    first = next(iter(bound))
    x = bound.pop(first)
    return x.detach(), bound


def _output(parent: nn.Module, call: tuple[tuple, dict]) -> torch.Tensor:
    with _products_in_fp32(parent):
        out = parent(*call[0], **call[1])
    return out[0] if isinstance(out, tuple) else out


class AwqUnit:
    """One mapping: the parent's calls (a spread of TOKENS positions) and mean|X| over every call, then the
    searched scale folded in and the linears clipped. Pad positions of right-padded batches are included (a
    few % of positions: rows are batched by length), as the call reaches the parent unmasked."""

    def __init__(self, found: AwqMapping, args: Any, scale_dtype: torch.dtype, tokens: int):
        self.found, self.args, self.scale_dtype = found, args, scale_dtype
        self.module = found.parent
        width = found.mapping.linears[0].in_features
        self.tokens = TOKENS.get(found.parent_device, TOKENS["cuda"])
        self.cost = self.tokens * (width * 2 + MASK_BYTES) + width * 8
        self.share = self.tokens / max(tokens, 1)
        self.calls: list[tuple[tuple, dict]] = []
        self.kept = self.seen = 0
        self.total: torch.Tensor | None = None
        self.count = 0

    def add(self, x: torch.Tensor) -> None:  # the Unit protocol's; add_call is what the pipeline calls
        self._keep(x.detach(), {})

    def add_call(self, args: tuple, kwargs: dict) -> None:
        self._keep(*_split_call(self.module, args, kwargs))

    def _keep(self, x: torch.Tensor, rest: dict) -> None:
        positions = x.numel() // x.shape[-1]
        sums = x.reshape(-1, x.shape[-1]).abs().float().sum(dim=0)
        self.total = sums if self.total is None else self.total + sums
        self.count += positions
        self.seen += positions
        if (not self.calls or self.kept + positions <= self.tokens) and self.kept <= self.share * self.seen:
            self.calls.append(((x,), rest))
            self.kept += positions

    @torch.no_grad()
    def finish(self) -> None:
        if self.total is None:
            return
        mapping, linears = self.found.mapping, self.found.mapping.linears
        x_mean = (self.total / self.count).to(linears[0].weight.device)
        scales = search_scale(self.found.parent, self.calls, linears, x_mean, self.args, self.scale_dtype)
        mapping.fold(scales)
        inputs = torch.cat([call[0][0].reshape(-1, call[0][0].shape[-1]) for call in self.calls])
        inputs = inputs.float() / scales.to(inputs.device)[None, :]
        self.calls, self.total = [], None
        for name, linear in zip(self.found.names, linears):
            if not any(part in name for part in NO_CLIP):
                clip(linear, inputs, self.args, self.scale_dtype)


class ClipUnit:
    """A linear no mapping scales (o_proj when grouped-query attention leaves v_proj narrower): AutoAWQ still
    clips it, on an even spread of CLIP_TOKENS of its real input rows."""

    def __init__(self, linear: nn.Linear, args: Any, scale_dtype: torch.dtype, tokens: int):
        self.module, self.args, self.scale_dtype = linear, args, scale_dtype
        self.cost = CLIP_TOKENS * linear.in_features * 2
        self.share = CLIP_TOKENS / max(tokens, 1)
        self.rows: list[torch.Tensor] = []
        self.kept = self.seen = 0

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1])
        self.seen += flat.shape[0]
        want = min(int(self.share * self.seen) - self.kept, flat.shape[0], CLIP_TOKENS - self.kept)
        if want > 0:
            self.rows.append(flat[torch.linspace(0, flat.shape[0] - 1, want).round().long().to(flat.device)])
            self.kept += want

    @torch.no_grad()
    def finish(self) -> None:
        if self.rows:
            clip(self.module, torch.cat(self.rows), self.args, self.scale_dtype)
        self.rows = []


def _common_parent(layer: nn.Module, names: list[str]) -> tuple[str, nn.Module]:
    """llmcompressor's parent: the lowest common ancestor of the linears' names (the linear itself when alone)."""
    prefix = os.path.commonprefix([n + "." for n in names])
    path = prefix[:prefix.rfind(".")] if len(names) > 1 else names[0]
    return path, layer.get_submodule(path) if path else layer


def _linear(layer: nn.Module, path: str) -> nn.Linear | None:
    found = layers.get_module(layer, path)
    return found if isinstance(found, nn.Linear) else None


def awq_mappings(model: nn.Module) -> list[AwqMapping]:
    """llmcompressor's default mappings per decoder layer, in the order they run: input_layernorm -> q/k/v
    (not for Gemma 3, whose q/k norms make it worse: llmcompressor's _gemma3_mappings), v_proj -> o_proj where
    v's outputs are o's inputs (not with grouped-query attention), the MLP's norm -> gate/up, up -> down."""
    prefix, stack = layers.decoder_layers(model)
    gemma3 = str(getattr(getattr(model, "config", None), "model_type", "")).startswith("gemma3")
    found: list[AwqMapping] = []
    for index, layer in enumerate(stack):
        where = f"{prefix}.{index}"
        norm_mappings = {m.name.rsplit(" ", 1)[-1]: m for m in layers.mappings_of(layer, where)}
        attention = norm_mappings.get("attention")
        if attention is not None and not gemma3:
            found.append(_with_parent(attention, layer))
        v, o = _linear(layer, "self_attn.v_proj"), _linear(layer, "self_attn.o_proj")
        qkv = _linear(layer, "self_attn.qkv_proj")
        if o is not None and v is not None and v.out_features == o.in_features:
            found.append(_with_parent(layers.Mapping(f"{where} v->o", v, [o]), layer))
        elif o is not None and qkv is not None and qkv.out_features == 3 * o.in_features:
            found.append(_with_parent(layers.Mapping(f"{where} qkv->o", qkv, [o]), layer))
        if "mlp" in norm_mappings:
            found.append(_with_parent(norm_mappings["mlp"], layer))
        up, down = _linear(layer, "mlp.up_proj") or _linear(layer, "mlp.gate_up_proj"), _linear(layer, "mlp.down_proj")
        if up is not None and down is not None:
            found.append(_with_parent(layers.Mapping(f"{where} up->down", up, [down]), layer))
    return found


def _with_parent(mapping: layers.Mapping, layer: nn.Module) -> AwqMapping:
    names = {module: name for name, module in layer.named_modules()}
    relative = [names[linear] for linear in mapping.linears]
    _, parent = _common_parent(layer, relative)
    return AwqMapping(mapping, parent, relative)


def units(model: nn.Module, linears: dict[str, nn.Linear], args: Any, scale_dtype: torch.dtype,
          tokens: int) -> list[Any]:
    """The AWQ units of every mapping, then a clipping unit for each linear no mapping scales (AutoAWQ clips
    every linear but q/k), in the order the layers run."""
    found = awq_mappings(model)
    scaled = {linear for f in found for linear in f.mapping.linears}
    order = {module: i for i, module in enumerate(model.modules())}
    out: list[Any] = [AwqUnit(f, args, scale_dtype, tokens) for f in found]
    out += [ClipUnit(linear, args, scale_dtype, tokens) for name, linear in linears.items()
            if linear not in scaled and not any(part in ".".join(name.split(".")[-2:]) for part in NO_CLIP)]
    return sorted(out, key=lambda unit: order[unit.module])
