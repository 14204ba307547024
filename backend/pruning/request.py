"""What a prune job was asked to remove, checked against the model's config.json before anything loads.

Torch-free: the CLI refuses a bad pick (a layer index out of range, every layer, a head pick that is not
the same in every layer) in one line before a worker starts, and the job checks the same way again.
Heads are pruned as whole key/value groups, the same number in every layer, because transformers'
Llama-style configs hold one num_attention_heads and one num_key_value_heads for all layers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.errors import bad_input

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
"""model_types whose decoder layers are self_attn.{q,k,v,o}_proj + mlp.{gate,up,down}_proj, one config for all."""
KNOWN = {"rank_only", "drop_layers", "layers", "drop_heads", "ffn_keep", "out", "overwrite", "samples", "dtype",
         "model", "max_new_tokens", "limit"}
DEFAULT_SAMPLES = 32
MIN_FFN_KEEP = 0.125
"""The smallest --ffn-keep: an eighth of each layer's FFN channels. A guard against a slip (0.0001 typed
for 0.75, a percentage read as a share), not a measured quality limit: below it most of every MLP is
gone; to shrink a model further, remove whole layers (--layers)."""


@dataclass(frozen=True)
class Shape:
    """The sizes pruning changes, from config.json."""

    model_type: str
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    layer_types: tuple[str, ...] = ()

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.kv_heads

    @classmethod
    def read(cls, folder: Path) -> "Shape":
        path = Path(folder) / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise bad_input(f"{path}: cannot be read ({exc.__class__.__name__}); pruning needs the model's config.json")
        kind = str(raw.get("model_type", ""))
        if kind not in SUPPORTED:
            raise bad_input(f"{path}: model_type {kind!r} cannot be pruned here; supported: {', '.join(SUPPORTED)}"
                            + (" (for a multimodal gemma3, prune its text model)" if kind == "gemma3" else ""))
        try:
            heads = int(raw["num_attention_heads"])
            return cls(kind, int(raw["num_hidden_layers"]), heads, int(raw.get("num_key_value_heads") or heads),
                       int(raw["intermediate_size"]), tuple(raw.get("layer_types") or ()))
        except (KeyError, TypeError, ValueError) as exc:
            raise bad_input(f"{path}: key {exc} is missing or not a number; pruning reads it to know the shapes")


@dataclass
class PruneRequest:
    """The options of one prune job (StartJob.params), each checked in one sentence."""

    rank_only: bool = False
    drop_layers: list[int] = field(default_factory=list)
    layers: int | None = None
    drop_heads: int | list[tuple[int, int]] | None = None
    ffn_keep: float | None = None
    out: str | None = None
    overwrite: bool = False
    samples: int = DEFAULT_SAMPLES
    dtype: str | None = None
    model: str | None = None
    max_new_tokens: int = 32
    limit: int | None = None  # held-out prompts scored (None: all)

    @classmethod
    def parse(cls, params: dict[str, Any]) -> "PruneRequest":
        unknown = set(params) - KNOWN
        if unknown:
            raise bad_input(f"unknown prune option(s) {sorted(unknown)}; known: {', '.join(sorted(KNOWN))}")
        req = cls(rank_only=bool(params.get("rank_only")), overwrite=bool(params.get("overwrite")),
                  out=params.get("out") or None, dtype=params.get("dtype") or None, model=params.get("model") or None)
        if req.dtype not in (None, "bf16", "fp16"):
            raise bad_input(f"prune dtype {req.dtype!r} is not bf16 or fp16")
        req.drop_layers = sorted({_whole(v, "drop_layers", 0) for v in params.get("drop_layers") or []})
        req.layers = None if params.get("layers") is None else _whole(params["layers"], "layers", 1)
        req.samples = _whole(params.get("samples", DEFAULT_SAMPLES), "samples", 1)
        req.max_new_tokens = _whole(params.get("max_new_tokens", 32), "max_new_tokens", 1)
        req.limit = None if params.get("limit") is None else _whole(params["limit"], "limit", 1)
        heads = params.get("drop_heads")
        if isinstance(heads, list):
            req.drop_heads = [parse_head(h) for h in heads] if heads else None
        elif heads is not None:
            req.drop_heads = _whole(heads, "drop_heads", 1)
        keep = params.get("ffn_keep")
        if keep is not None:
            if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
                raise bad_input(f"ffn_keep must be a share above 0 and at most 1 (e.g. 0.75), got {keep!r}")
            req.ffn_keep = float(keep)
        if req.drop_layers and req.layers is not None:
            raise bad_input("give layers to drop by index (drop_layers) or by count (layers), not both")
        if not req.rank_only and not (req.drop_layers or req.layers or req.drop_heads or req.ffn_keep):
            raise bad_input("nothing to prune: pick --drop-layers, --layers N, --drop-heads or --ffn-keep, "
                            "or pass --rank-only to see the ranking first")
        return req

    def check(self, shape: Shape) -> None:
        """Refuse a pick this model cannot take, naming the figure and the range."""
        n = shape.layers
        bad = [i for i in self.drop_layers if i >= n]
        if bad:
            raise bad_input(f"--drop-layers {','.join(map(str, bad))}: out of range; this model has {n} layers, "
                            f"numbered 0 to {n - 1}")
        dropped = len(self.drop_layers) or (self.layers or 0)
        if dropped >= n:
            raise bad_input(f"dropping {dropped} of the model's {n} layers would leave none; keep at least one "
                            f"(at most --layers {n - 1})")
        if self.drop_heads is not None:
            self._check_heads(shape)
        if self.ffn_keep is not None and self.ffn_keep < MIN_FFN_KEEP:
            kept, floor = kept_channels(shape.intermediate, self.ffn_keep), kept_channels(shape.intermediate, MIN_FFN_KEEP)
            raise bad_input(f"--ffn-keep {self.ffn_keep:g}: keeps {kept:,} of {shape.intermediate:,} FFN channels per "
                            f"layer; keep at least {MIN_FFN_KEEP:g} ({floor:,}), or remove whole layers instead (--layers)")

    def _check_heads(self, shape: Shape) -> None:
        groups = shape.kv_heads
        what = (f"this model has {shape.kv_heads} key/value head(s) per layer, each shared by "
                f"{shape.heads_per_group} query head(s)")
        if groups < 2:
            raise bad_input(f"head pruning: {what}, so removing a group would remove all of attention; "
                            "prune layers or FFN channels instead")
        if isinstance(self.drop_heads, int):
            if self.drop_heads >= groups:
                raise bad_input(f"--drop-heads {self.drop_heads}: {what}; drop at most {groups - 1} per layer")
            return
        per_layer: dict[int, set[int]] = {}
        for layer, group in self.drop_heads or []:
            if layer >= shape.layers or group >= groups:
                raise bad_input(f"--drop-heads {layer}:{group}: out of range; layers 0 to {shape.layers - 1}, "
                                f"key/value groups 0 to {groups - 1}")
            per_layer.setdefault(layer, set()).add(group)
        counts = {len(per_layer.get(i, ())) for i in range(shape.layers)}
        if len(counts) != 1:
            raise bad_input("--drop-heads: transformers keeps one head count for every layer, so each layer must "
                            f"lose the same number of key/value groups (got {sorted(counts)} across layers); "
                            "give a count instead (--drop-heads N drops each layer's N least important)")
        if counts == {groups}:
            raise bad_input(f"--drop-heads: {what}; keep at least one group per layer")

    def picks(self, shape: Shape) -> str:
        """One line naming what will be removed."""
        parts = []
        if self.drop_layers:
            parts.append(f"layers {','.join(map(str, self.drop_layers))}")
        elif self.layers:
            parts.append(f"the {self.layers} least important layer(s)")
        if isinstance(self.drop_heads, int):
            parts.append(f"{self.drop_heads} of {shape.kv_heads} key/value group(s) per layer "
                         f"({self.drop_heads * shape.heads_per_group} query heads)")
        elif self.drop_heads:
            parts.append(f"key/value groups {','.join(f'{l}:{g}' for l, g in self.drop_heads)}")
        if self.ffn_keep is not None:
            parts.append(f"FFN channels down to {self.ffn_keep:.0%} ({kept_channels(shape.intermediate, self.ffn_keep)} "
                         f"of {shape.intermediate}) per layer")
        return "; ".join(parts) or "nothing (ranking only)"


def out_problem(out: Path, overwrite: bool, protected: list[Path]) -> str:
    """Why the pruned model cannot be written into `out` ("" when it can): the run's or the model's own
    folder, or one that holds files without overwrite."""
    for own in protected:
        own = Path(own).resolve()
        if out.resolve() == own or out.resolve() in own.parents:
            return f"{out} would overwrite {own}; pick another --out"
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not overwrite)):
        return f"{out} already holds files; pass --overwrite to replace them, or --out elsewhere"
    return ""


def kept_channels(intermediate: int, share: float) -> int:
    """FFN channels kept per layer for a share: rounded, at least one."""
    return max(1, min(intermediate, round(intermediate * share)))


def parse_head(text: Any) -> tuple[int, int]:
    """'LAYER:GROUP' -> (layer, group)."""
    try:
        layer, group = str(text).split(":")
        pair = int(layer), int(group)
        if min(pair) < 0:
            raise ValueError
        return pair
    except ValueError:
        raise bad_input(f"--drop-heads {text!r}: give LAYER:GROUP pairs (e.g. 0:1,1:1) or a count N") from None


def _whole(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad_input(f"prune option {name} must be a whole number of at least {low}, got {value!r}")
    return value
