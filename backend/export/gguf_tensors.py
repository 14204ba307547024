"""Which GGUF tensors a model's tensors become, and how each is rearranged on the way (llama.cpp's layout).

`plan_tensors` maps the TensorSource's names, whether the checkpoint's on-disk names (per-expert MoE
tensors, `embed_out`, no tied `lm_head`) or transformers' in-memory ones (fused 3-D experts, a tied
`lm_head`), to gguf's own tensor names for the family's architecture, following convert_hf_to_gguf.py:
llama's Q/K rows permuted to GGML's rotary layout, GPT-2's Conv1D weights transposed, GPT-NeoX's
per-head fused QKV reordered into Q, K, V blocks, Gemma's norms shifted by +1, experts stacked into
3-D `ffn_{gate,up,down}_exps`, generated rotary factor tensors (Llama 3, Phi-3 longrope).
`matrices` then yields a planned tensor's data one piece at a time (one expert at a time for stacked
experts), so the writer never needs more than one expert matrix in fp32.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterator

import gguf
import numpy as np

from backend.core.errors import bad_input
from backend.export.gguf_families import Family, head_dim, kv_heads, phi3_rope_dims, rope_of
from backend.export.tensor_source import TensorSource

EXPERT = re.compile(r"^(?P<block>.*\.(?:layers|h)\.(?P<layer>\d+))\.(?:mlp|block_sparse_moe)\.experts\.(?P<expert>\d+)\."
                    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
FUSED = re.compile(r"^(?P<block>.*\.(?:layers|h)\.(?P<layer>\d+))\.(?:mlp|block_sparse_moe)\.experts\."
                   r"(?P<proj>gate_up_proj|down_proj)(?:\.weight)?$")
PROJECTION = {"w1": "gate", "w3": "up", "w2": "down", "gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
RENAMES = (("model.language_model.", "model."), ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
           ("model.text_model.", "model."))
SKIPPED = ("model.vision_tower.", "vision_tower.", "model.multi_modal_projector.", "multi_modal_projector.",
           "model.visual.", "visual.", "model.vision_model.", "model.connector.")
"""A vision-language model's tower and projector: the mmproj file's (gguf_mmproj.py), not the language model's."""
BUFFERS = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias")
HEADS = ("lm_head.weight", "embed_out.weight")
_EXPS = {"gate": gguf.MODEL_TENSOR.FFN_GATE_EXP, "up": gguf.MODEL_TENSOR.FFN_UP_EXP, "down": gguf.MODEL_TENSOR.FFN_DOWN_EXP}
GPT2_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


@dataclass
class TensorPlan:
    gguf_name: str
    shape: tuple[int, ...]  # numpy (row-major, Hugging Face) order of the tensor as written
    sources: tuple[str, ...] = ()  # several for experts stacked along axis 0
    op: str = "copy"  # copy | permute | transpose | neox_qkv | squeeze | first_half | second_half | stack | values
    heads: int = 0
    shift: float = 0.0
    values: np.ndarray | None = None
    ggml_type: Any = None  # gguf.GGMLQuantizationType, set by the writer
    nbytes: int = 0

    @property
    def hf_name(self) -> str:
        return self.sources[0] if self.sources else self.gguf_name


def canonical(name: str) -> str | None:
    """The name in the text model's plain layout, or None for tensors GGUF leaves out."""
    if name.startswith(SKIPPED) or name.endswith(BUFFERS):
        return None
    for old, new in RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _tensor_name(key: Any, layer: int | None = None) -> str:
    return gguf.TENSOR_NAMES[key].format(bid=layer) + ".weight"


def plan_tensors(family: Family, cfg: Any, source: TensorSource, tied: bool) -> list[TensorPlan]:
    arch = getattr(gguf.MODEL_ARCH, family.arch)
    names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers if hasattr(cfg, "num_hidden_layers") else cfg.n_layer)
    plans: list[TensorPlan] = []
    experts: dict[tuple[int, str], dict[int, str]] = {}
    embed_source = None
    head_seen = False
    for hf_name in source.names():
        name = canonical(hf_name)
        if name is None:
            continue
        if name in HEADS:
            head_seen = True
            if tied:
                continue  # llama.cpp reads token_embd as the output head when output.weight is absent
            if family.no_output:
                raise bad_input(f"this model's output head ({hf_name}) is not tied to its embeddings, but "
                                f"llama.cpp's {family.name} always uses the embeddings as the output head",
                                "export merged instead")
        if match := EXPERT.match(name):
            key = (int(match["layer"]), PROJECTION[match["proj"]])
            if key not in experts:
                experts[key] = {}
                plans.append(TensorPlan(_tensor_name(_EXPS[key[1]], key[0]), (), op="experts"))
            experts[key][int(match["expert"])] = hf_name
            continue
        shape = tuple(source.shape(hf_name))
        if match := FUSED.match(name):
            layer = int(match["layer"])
            if match["proj"] == "down_proj":
                plans.append(TensorPlan(_tensor_name(_EXPS["down"], layer), shape, (hf_name,)))
            else:  # (experts, 2 * ffn, hidden): gate rows first, then up
                half = (shape[0], shape[1] // 2, shape[2])
                plans.append(TensorPlan(_tensor_name(_EXPS["gate"], layer), half, (hf_name,), op="first_half"))
                plans.append(TensorPlan(_tensor_name(_EXPS["up"], layer), half, (hf_name,), op="second_half"))
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise bad_input(f"tensor {hf_name} has no GGUF name in llama.cpp's {family.name} architecture",
                            "export merged instead")
        plan = TensorPlan(gguf_name, shape, (hf_name,))
        _transform(plan, family, cfg, name)
        plans.append(plan)
        if gguf_name == "token_embd.weight":
            embed_source = hf_name
    _fill_experts(plans, experts, source)
    if tied and family.output_required and embed_source is not None:
        plans.append(TensorPlan("output.weight", tuple(source.shape(embed_source)), (embed_source,)))
    if not tied and not head_seen and not family.no_output:
        raise bad_input("the model has untied embeddings but no output head tensor (lm_head.weight)")
    plans.extend(_generated(family, cfg))
    return plans


def _transform(plan: TensorPlan, family: Family, cfg: Any, name: str) -> None:
    """The rearrangement llama.cpp's converter applies to this tensor (set on the plan)."""
    if family.permute_qk and (".q_proj." in name or ".k_proj." in name):
        plan.op, plan.heads = "permute", cfg.num_attention_heads if ".q_proj." in name else kv_heads(cfg)
    elif family.arch == "GPT2" and name.endswith(GPT2_CONV1D):
        plan.op, plan.shape = "transpose", plan.shape[::-1]
    elif family.arch == "GPTNEOX" and ".attention.query_key_value." in name:
        plan.op, plan.heads = "neox_qkv", cfg.num_attention_heads
    elif plan.gguf_name.endswith(".ffn_gate_inp_shexp.weight") and len(plan.shape) == 2 and plan.shape[0] == 1:
        plan.op, plan.shape = "squeeze", plan.shape[1:]  # llama.cpp declares the shared-expert gate {n_embd}
    if family.norm_shift and name.endswith("norm.weight"):
        plan.shift = family.norm_shift


def _fill_experts(plans: list[TensorPlan], experts: dict[tuple[int, str], dict[int, str]], source: TensorSource) -> None:
    pending = {p.gguf_name: p for p in plans if p.op == "experts"}
    for (layer, kind), found in experts.items():
        plan = pending[_tensor_name(_EXPS[kind], layer)]
        order = sorted(found)
        if order != list(range(len(order))):
            raise bad_input(f"layer {layer} has experts {order} for {kind}; expected 0..{len(order) - 1}")
        plan.sources = tuple(found[i] for i in order)
        plan.shape = (len(order), *source.shape(plan.sources[0]))
        plan.op = "stack"


def _generated(family: Family, cfg: Any) -> list[TensorPlan]:
    """Rotary factor tensors llama.cpp reads instead of the config's scaling parameters."""
    rope = rope_of(cfg)
    if rope["rope_type"] == "llama3":
        values = llama3_rope_factors(rope, head_dim(cfg))
        return [TensorPlan(_tensor_name(gguf.MODEL_TENSOR.ROPE_FREQS), values.shape, op="values", values=values)]
    if rope["rope_type"] == "longrope":
        long, short = (np.asarray(rope[k], dtype=np.float32) for k in ("long_factor", "short_factor"))
        if not (len(long) == len(short) == phi3_rope_dims(cfg) // 2):
            raise bad_input(f"rope long/short factors have {len(long)}/{len(short)} entries; expected "
                            f"{phi3_rope_dims(cfg) // 2} (half the rotary dimensions)")
        return [TensorPlan(_tensor_name(gguf.MODEL_TENSOR.ROPE_FACTORS_LONG), long.shape, op="values", values=long),
                TensorPlan(_tensor_name(gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT), short.shape, op="values", values=short)]
    return []


def llama3_rope_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    """Llama 3.1's frequency-dependent rotary scaling as the per-frequency divisors llama.cpp applies."""
    base = float(rope["rope_theta"])
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old_context = float(rope.get("original_max_position_embeddings", 8192))
    out = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotary layout (halves of a head) -> GGML's (interleaved pairs), rows of each head."""
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def neox_qkv(weights: np.ndarray, n_head: int) -> np.ndarray:
    """GPT-NeoX's per-head [q k v] row groups -> all Q rows, then all K, then all V (llama.cpp's attn_qkv)."""
    per_head = weights.reshape(n_head, 3, weights.shape[0] // n_head // 3, *weights.shape[1:])
    return np.concatenate([per_head[:, i].reshape(-1, *weights.shape[1:]) for i in range(3)], axis=0)


def _fp32(source: TensorSource, name: str) -> np.ndarray:
    return source.get(name).float().numpy()


def matrices(plan: TensorPlan, source: TensorSource) -> Iterator[np.ndarray]:
    """The planned tensor's fp32 data in pieces along axis 0 (one expert at a time when stacked)."""
    if plan.op == "values":
        yield plan.values
        return
    if plan.op == "stack":
        for name in plan.sources:
            yield _fp32(source, name)[None]
        return
    array = _fp32(source, plan.sources[0])
    if plan.op == "permute":
        array = permute(array, plan.heads)
    elif plan.op == "transpose":
        array = array.T
    elif plan.op == "neox_qkv":
        array = neox_qkv(array, plan.heads)
    elif plan.op == "squeeze":
        array = array.reshape(plan.shape)
    elif plan.op in ("first_half", "second_half"):
        half = array.shape[1] // 2
        array = array[:, :half] if plan.op == "first_half" else array[:, half:]
    if plan.shift:
        array = array + plan.shift
    yield np.ascontiguousarray(array)

