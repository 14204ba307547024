"""Model families and their numbers: config.json to Arch and Dims, linears, parameter counts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from backend.paths import BUNDLED_PREFIX, resolve_resource


@dataclass(frozen=True)
class Arch:
    """What the estimator needs to know about a model family beyond config.json's numbers."""

    family: str
    norm: Literal["rms", "layer"]
    gated_mlp: bool
    fused_qkv: bool
    fused_gate_up: bool
    parallel_residual: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    names: dict[str, str]
    """Module names of the roles q, k, v (or qkv), o, gate, up (or gate_up), down / fc1, fc2."""
    query_layout_bshd: bool
    """Whether the rotated query keeps the (batch, seq, heads, dim) memory layout of the projection,
    so SDPA's output is already contiguous for o_proj (Llama) or is copied again (GPT-NeoX's cat)."""
    measured: bool
    """Checked against real tensors in bench/estimate_accuracy.py."""


LLAMA = Arch(
    family="llama",
    norm="rms",
    gated_mlp=True,
    fused_qkv=False,
    fused_gate_up=False,
    parallel_residual=False,
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj", "down": "down_proj"},
    query_layout_bshd=True,
    measured=True,
)
GPT_NEOX = Arch(
    family="gpt_neox",
    norm="layer",
    gated_mlp=False,
    fused_qkv=True,
    fused_gate_up=False,
    parallel_residual=True,
    qkv_bias=True,
    o_bias=True,
    mlp_bias=True,
    names={"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    query_layout_bshd=False,
    measured=True,
)
PHI3 = Arch(
    family="phi3",
    norm="rms",
    gated_mlp=True,
    fused_qkv=True,
    fused_gate_up=True,
    parallel_residual=False,
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    names={"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj"},
    query_layout_bshd=False,
    measured=False,
)

ARCHITECTURES: dict[str, Arch] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": Arch(**{**LLAMA.__dict__, "family": "qwen2", "qkv_bias": True}),
    "gpt_neox": GPT_NEOX,
    "phi3": PHI3,
}
"""config.json's model_type -> Arch. Unknown types are estimated as Llama-style, with a warning."""


@dataclass(frozen=True)
class Dims:
    """The numbers read from config.json."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    rotary_dim: int
    parallel_residual: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    act: str

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def load_model_config(model_config: dict[str, Any] | str | Path) -> dict[str, Any]:
    """config.json as a dict, from a dict, a folder holding config.json, the file, or `bundled:NAME`."""
    if isinstance(model_config, dict):
        return model_config
    text = str(model_config)
    path = resolve_resource(text) if text.startswith(BUNDLED_PREFIX) else Path(text).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no config.json; point model.path at a Hugging Face model folder") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return raw


def read_dims(raw: dict[str, Any]) -> tuple[Arch, Dims, list[str]]:
    """The architecture family and numbers of a config.json dict, plus warnings."""
    warnings: list[str] = []
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        raw = {**raw["text_config"], "model_type": raw["text_config"].get("model_type", raw.get("model_type"))}
    model_type = str(raw.get("model_type", "llama"))
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        warnings.append(f"model_type {model_type!r} is not in the architecture table; estimated as a Llama-style decoder")
        arch = LLAMA
    elif not arch.measured:
        warnings.append(f"{model_type}: derived from the same rules, not measured against real tensors")

    def need(key: str) -> int:
        value = raw.get(key)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.json: {key} is missing or not a positive integer")
        return value

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    layers = need("num_hidden_layers")
    vocab = need("vocab_size")
    intermediate = raw.get("intermediate_size") or 4 * hidden
    kv_heads = raw.get("num_key_value_heads") or heads
    head_dim = raw.get("head_dim") or hidden // heads
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    factor = raw.get("rotary_pct", raw.get("partial_rotary_factor", None))
    if factor is None and isinstance(rope, dict):
        factor = rope.get("partial_rotary_factor")
    if factor is None:
        factor = 1.0
    rotary_dim = int(head_dim * float(factor))
    tied = bool(raw.get("tie_word_embeddings", False))
    parallel = bool(raw.get("use_parallel_residual", arch.parallel_residual)) if arch.family == "gpt_neox" else arch.parallel_residual
    if arch.family == "gpt_neox":
        qkv_bias = o_bias = bool(raw.get("attention_bias", True))
        mlp_bias = True
    elif arch.family == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
    else:
        qkv_bias = o_bias = bool(raw.get("attention_bias", arch.qkv_bias))
        mlp_bias = bool(raw.get("mlp_bias", arch.mlp_bias))
    act = str(raw.get("hidden_act", "silu" if arch.gated_mlp else "gelu"))
    if act in ("gelu_new", "gelu_fast", "quick_gelu"):
        warnings.append(f"hidden_act {act}: its Python implementation saves a few more tensors than counted")
    dims = Dims(
        model_type=model_type,
        hidden=hidden,
        intermediate=int(intermediate),
        layers=layers,
        heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab=vocab,
        tied=tied,
        rotary_dim=rotary_dim,
        parallel_residual=parallel,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        act=act,
    )
    return arch, dims, warnings


@dataclass(frozen=True)
class Linear:
    role: str
    name: str
    inp: int
    out: int
    bias: bool


def layer_linears(arch: Arch, d: Dims) -> list[Linear]:
    """The linear layers of one decoder layer (in forward order)."""
    n = arch.names
    out: list[Linear] = []
    if arch.fused_qkv:
        out.append(Linear("qkv", n["qkv"], d.hidden, d.q_dim + 2 * d.kv_dim, d.qkv_bias))
    else:
        out.append(Linear("q", n["q"], d.hidden, d.q_dim, d.qkv_bias))
        out.append(Linear("k", n["k"], d.hidden, d.kv_dim, d.qkv_bias))
        out.append(Linear("v", n["v"], d.hidden, d.kv_dim, d.qkv_bias))
    out.append(Linear("o", n["o"], d.q_dim, d.hidden, d.o_bias))
    if arch.gated_mlp:
        if arch.fused_gate_up:
            out.append(Linear("gate_up", n["gate_up"], d.hidden, 2 * d.intermediate, d.mlp_bias))
        else:
            out.append(Linear("gate", n["gate"], d.hidden, d.intermediate, d.mlp_bias))
            out.append(Linear("up", n["up"], d.hidden, d.intermediate, d.mlp_bias))
        out.append(Linear("down", n["down"], d.intermediate, d.hidden, d.mlp_bias))
    else:
        out.append(Linear("fc1", n["fc1"], d.hidden, d.intermediate, d.mlp_bias))
        out.append(Linear("fc2", n["fc2"], d.intermediate, d.hidden, d.mlp_bias))
    return out


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by kind, for the whole model."""

    linear_weights: int
    """Decoder linears' weight matrices (what bitsandbytes quantizes)."""
    linear_biases: int
    norms: int
    embedding: int
    lm_head: int
    """Zero when tied to the embedding."""
    linear_tensors: int
    other_tensors: int
    largest_linear: int

    @property
    def total(self) -> int:
        return self.linear_weights + self.linear_biases + self.norms + self.embedding + self.lm_head

    @property
    def tensors(self) -> int:
        return self.linear_tensors + self.other_tensors


def count_params(arch: Arch, d: Dims) -> ParamCounts:
    """Parameters derived from the architecture (matches model.num_parameters() for the table's types)."""
    lins = layer_linears(arch, d)
    lw = sum(l.inp * l.out for l in lins) * d.layers
    lb = sum(l.out for l in lins if l.bias) * d.layers
    per_norm = d.hidden * (2 if arch.norm == "layer" else 1)
    norms = per_norm * (2 * d.layers + 1)
    lin_tensors = d.layers * sum(2 if l.bias else 1 for l in lins)
    norm_tensors = (2 * d.layers + 1) * (2 if arch.norm == "layer" else 1)
    other = norm_tensors + 1 + (0 if d.tied else 1)
    return ParamCounts(
        linear_weights=lw,
        linear_biases=lb,
        norms=norms,
        embedding=d.vocab * d.hidden,
        lm_head=0 if d.tied else d.vocab * d.hidden,
        linear_tensors=lin_tensors,
        other_tensors=other,
        largest_linear=max(l.inp * l.out for l in lins),
    )
