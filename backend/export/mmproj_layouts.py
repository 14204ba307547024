"""How llama.cpp's converter writes each vision family's mmproj GGUF: one `MmprojLayout` per family.

Transcribed from convert_hf_to_gguf.py's mmproj classes (llama-cpp-python 0.3.36's vendored copy:
conversion/qwenvl.py `Qwen2VLVisionModel`, gemma.py `Gemma3VisionModel`, smolvlm.py `SmolVLMModel`,
base.py `MmprojModel`): which checkpoint names are the tower and projector (renamed to the names
gguf-py's MMPROJ tensor map knows), the `clip.*` keys, the rearrangements (Qwen's fused QKV split in
three, its Conv3D patch embedding split into two Conv2D kernels, Gemma's `1 + w` projector norm folded
in) and the tensors kept in F32. `expected` is the other direction, written by hand from clip.cpp's
tensor names rather than derived from gguf-py's map, so the export's check (gguf_mmproj_check.py)
catches a mapping the writer got wrong. The keys in VISION_FAMILIES that set `gguf_projector` and the
keys here must agree (asserted below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from backend.core.registries.vision_families import VISION_FAMILIES

Config = dict[str, Any]
DEEPSTACK = "visual.deepstack_merger_list."
Extra = Callable[[Config, Config, Config, Any], None]
"""(config.json, its vision_config, the processor settings, gguf writer) -> the family's own keys."""



@dataclass(frozen=True)
class MmprojLayout:
    """One family's mmproj file, as the converter writes it."""

    projector_type: str  # clip.projector_type (gguf.VisionProjectorType's value)
    renames: tuple[tuple[str, str], ...]  # checkpoint or in-memory prefix -> the converter's name for it
    depth_keys: tuple[str, ...]  # vision_config keys of (layers, heads, width, ffn width)
    extra: Extra
    expected: tuple[tuple[str, tuple[str, ...]], ...]
    """(converter name with {0} for the block, the GGUF names it becomes, in order): the check's inverse."""
    f32: tuple[str, ...] = ()  # converter-name fragments kept F32 whatever the type (tensor_force_quant)
    norm_shift: tuple[str, ...] = ()  # converter names stored as w + 1 (Gemma's RMSNorm computes x * (1 + w))
    problems: Callable[[Config], list[str]] = lambda vision: []
    split_qkv: bool = False  # a fused QKV written as three tensors (Qwen2.5-VL; Qwen3-VL keeps it fused)
    fixups: tuple[tuple[str, str], ...] = ()  # further renames inside the converter name (its modify_tensors)
    deepstack: bool = False  # deepstack_merger_list.i is numbered by the tower block it follows (Qwen3-VL)

    def converter_name(self, name: str, vision: Config | None = None) -> str | None:
        """The name convert_hf_to_gguf.py maps for this tensor, or None when it is not the tower's or projector's."""
        for prefix, to in self.renames:
            if name.startswith(prefix):
                out = to + name[len(prefix):].replace("_weight", ".weight")
                for old, new in self.fixups:
                    out = out.replace(old, new)
                if self.deepstack and out.startswith(DEEPSTACK):
                    index, rest = out[len(DEEPSTACK):].split(".", 1)
                    block = list((vision or {}).get("deepstack_visual_indexes") or [])[int(index)]
                    out = f"model.{DEEPSTACK}{block}.{rest}"
                return out
        return None

    def image_size(self, vision: Config) -> int:
        """clip.vision.image_size: the tower's, else Qwen3-VL's from its position table, else the converter's 560."""
        if "image_size" in vision:
            return int(vision["image_size"])
        if "num_position_embeddings" in vision:
            return int(int(vision["num_position_embeddings"]) ** 0.5 * int(vision.get("patch_size", 16)))
        return 560

    def common(self, vision: Config, processor: Config, text_hidden: int, w: Any) -> None:
        """MmprojModel.set_gguf_parameters: the keys every vision tower writes."""
        layers, heads, width, ffn = (int(vision[k]) for k in self.depth_keys)
        w.add_clip_has_vision_encoder(True)
        w.add_vision_projection_dim(text_hidden)
        w.add_vision_image_size(self.image_size(vision))
        w.add_vision_patch_size(int(vision["patch_size"]))
        w.add_vision_embedding_length(width)
        w.add_vision_feed_forward_length(ffn)
        w.add_vision_block_count(layers)
        w.add_vision_head_count(heads)
        w.add_vision_image_mean([float(v) for v in processor["image_mean"]])
        w.add_vision_image_std([float(v) for v in processor["image_std"]])


# --- Qwen2.5-VL: Qwen2VLVisionModel ---------------------------------------------------------------------


def _qwen25_extra(config: Config, vision: Config, processor: Config, w: Any) -> None:
    w.add_clip_projector_type("qwen2.5vl_merger")
    w.add_vision_use_silu(True)
    w.add_vision_n_wa_pattern(int(vision["fullatt_block_indexes"][0]) + 1)
    w.add_vision_attention_layernorm_eps(float(config.get("rms_norm_eps", 1e-6)))  # the top-level key, as the converter
    if int(vision.get("spatial_merge_size", 2)) != 2:  # clip.cpp's default; the converter writes none
        w.add_vision_spatial_merge_size(int(vision["spatial_merge_size"]))


def _qwen25_problems(vision: Config) -> list[str]:
    problems = []
    full = list(vision.get("fullatt_block_indexes") or [])
    if not full or any(b - a != full[0] + 1 for a, b in zip(full, full[1:])):
        problems.append(f"fullatt_block_indexes {full} (llama.cpp takes full attention every n-th block)")
    if int(vision.get("temporal_patch_size", 2)) != 2:
        problems.append("temporal_patch_size other than 2 (the converter splits the Conv3D kernel in two)")
    return problems


_QWEN_EXPECTED = (
    ("visual.patch_embed.proj.weight", ("v.patch_embd.weight", "v.patch_embd.weight.1")),
    ("visual.blocks.{0}.attn.qkv.weight", ("v.blk.{0}.attn_q.weight", "v.blk.{0}.attn_k.weight", "v.blk.{0}.attn_v.weight")),
    ("visual.blocks.{0}.attn.qkv.bias", ("v.blk.{0}.attn_q.bias", "v.blk.{0}.attn_k.bias", "v.blk.{0}.attn_v.bias")),
    ("visual.blocks.{0}.attn.proj.weight", ("v.blk.{0}.attn_out.weight",)),
    ("visual.blocks.{0}.attn.proj.bias", ("v.blk.{0}.attn_out.bias",)),
    ("visual.blocks.{0}.norm1.weight", ("v.blk.{0}.ln1.weight",)),
    ("visual.blocks.{0}.norm2.weight", ("v.blk.{0}.ln2.weight",)),
    ("visual.blocks.{0}.mlp.gate_proj.weight", ("v.blk.{0}.ffn_gate.weight",)),
    ("visual.blocks.{0}.mlp.gate_proj.bias", ("v.blk.{0}.ffn_gate.bias",)),
    ("visual.blocks.{0}.mlp.up_proj.weight", ("v.blk.{0}.ffn_up.weight",)),
    ("visual.blocks.{0}.mlp.up_proj.bias", ("v.blk.{0}.ffn_up.bias",)),
    ("visual.blocks.{0}.mlp.down_proj.weight", ("v.blk.{0}.ffn_down.weight",)),
    ("visual.blocks.{0}.mlp.down_proj.bias", ("v.blk.{0}.ffn_down.bias",)),
    ("visual.merger.ln_q.weight", ("v.post_ln.weight",)),
    ("visual.merger.mlp.0.weight", ("mm.0.weight",)),
    ("visual.merger.mlp.0.bias", ("mm.0.bias",)),
    ("visual.merger.mlp.2.weight", ("mm.2.weight",)),
    ("visual.merger.mlp.2.bias", ("mm.2.bias",)),
)

# --- Qwen3-VL: Qwen3VLVisionModel -------------------------------------------------------------------------


def _qwen3_extra(config: Config, vision: Config, processor: Config, w: Any) -> None:
    w.add_clip_projector_type("qwen3vl_merger")
    w.add_vision_use_gelu(True)
    if vision.get("spatial_merge_size") is not None:
        w.add_vision_spatial_merge_size(int(vision["spatial_merge_size"]))
    w.add_vision_attention_layernorm_eps(float((config.get("text_config") or {}).get("rms_norm_eps", 1e-6)))
    layers = [False] * int(vision["depth"])
    for index in vision.get("deepstack_visual_indexes") or []:
        layers[int(index)] = True
    w.add_vision_is_deepstack_layers(layers)


def _qwen3_problems(vision: Config) -> list[str]:
    problems = [] if int(vision.get("temporal_patch_size", 2)) == 2 else [
        "temporal_patch_size other than 2 (the converter splits the Conv3D kernel in two)"]
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    return problems + ([] if act in ("gelu_pytorch_tanh", "gelu") else [f"hidden_act {act} (clip.cpp computes GELU)"])


_QWEN3_EXPECTED = (
    ("visual.patch_embed.proj.weight", ("v.patch_embd.weight", "v.patch_embd.weight.1")),
    ("visual.patch_embed.proj.bias", ("v.patch_embd.bias",)),
    ("visual.pos_embed.weight", ("v.position_embd.weight",)),
    *((f"visual.blocks.{{0}}.{hf}.{p}", (f"v.blk.{{0}}.{gg}.{p}",)) for hf, gg in (
        ("attn.qkv", "attn_qkv"), ("attn.proj", "attn_out"), ("norm1", "ln1"), ("norm2", "ln2"),
        ("mlp.linear_fc1", "ffn_up"), ("mlp.linear_fc2", "ffn_down")) for p in ("weight", "bias")),
    *((f"visual.merger.{hf}.{p}", (f"{gg}.{p}",)) for hf, gg in (
        ("mlp.0", "mm.0"), ("mlp.2", "mm.2"), ("ln_q", "v.post_ln")) for p in ("weight", "bias")),
    *((f"model.{DEEPSTACK}{{0}}.{hf}.{p}", (f"v.deepstack.{{0}}.{gg}.{p}",)) for hf, gg in (
        ("norm", "norm"), ("linear_fc1", "fc1"), ("linear_fc2", "fc2")) for p in ("weight", "bias")),
)

# --- SigLIP towers: Gemma 3 (Gemma3VisionModel) and SmolVLM / Idefics3 (SmolVLMModel) --------------------


def _siglip_expected(tower: str, projector: tuple[tuple[str, tuple[str, ...]], ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    layer = f"{tower}encoder.layers.{{0}}."
    rows = [(f"{tower}embeddings.patch_embedding.{p}", (f"v.patch_embd.{p}",)) for p in ("weight", "bias")]
    rows += [(f"{tower}embeddings.position_embedding.weight", ("v.position_embd.weight",))]
    rows += [(f"{tower}post_layernorm.{p}", (f"v.post_ln.{p}",)) for p in ("weight", "bias")]
    pairs = (("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
             ("self_attn.out_proj", "attn_out"), ("layer_norm1", "ln1"), ("layer_norm2", "ln2"),
             ("mlp.fc1", "ffn_up"), ("mlp.fc2", "ffn_down"))
    rows += [(f"{layer}{hf}.{p}", (f"v.blk.{{0}}.{gg}.{p}",)) for hf, gg in pairs for p in ("weight", "bias")]
    return tuple(rows) + projector


def _gemma3_extra(config: Config, vision: Config, processor: Config, w: Any) -> None:
    w.add_clip_projector_type("gemma3")
    w.add_vision_attention_layernorm_eps(float(vision.get("layer_norm_eps", 1e-6)))
    w.add_vision_use_gelu(True)
    per_side = int(int(processor.get("image_seq_length", config.get("mm_tokens_per_image", 256))) ** 0.5)
    scale = (int(vision["image_size"]) // int(vision["patch_size"])) // per_side
    if scale > 0 and scale != 4:  # clip.cpp's default; the converter writes it only for other models
        w.add_vision_projector_scale_factor(scale)


def _smolvlm_extra(config: Config, vision: Config, processor: Config, w: Any) -> None:
    w.add_clip_projector_type("idefics3")
    w.add_vision_attention_layernorm_eps(float(vision.get("layer_norm_eps", 1e-5)))
    w.add_vision_projector_scale_factor(int(config.get("scale_factor", 2)))
    w.add_vision_use_gelu(True)
    size = processor.get("size") if isinstance(processor.get("size"), dict) else {}
    w.add_vision_preproc_image_size(int(size.get("longest_edge", vision["image_size"])))


def _gelu_problems(vision: Config) -> list[str]:
    act = vision.get("hidden_act", "gelu_pytorch_tanh")
    return [] if act in ("gelu_pytorch_tanh", "gelu_new", "gelu") else [f"hidden_act {act} (clip.cpp computes GELU)"]


_SIGLIP_DEPTH = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size")
MMPROJ_LAYOUTS: dict[str, MmprojLayout] = {
    "qwen2_5_vl": MmprojLayout(
        "qwen2.5vl_merger", (("model.visual.", "visual."), ("visual.", "visual.")),
        ("depth", "num_heads", "hidden_size", "intermediate_size"), _qwen25_extra, _QWEN_EXPECTED,
        problems=_qwen25_problems, split_qkv=True),
    "qwen3_vl": MmprojLayout(
        "qwen3vl_merger", (("model.visual.", "visual."), ("visual.", "visual.")),
        ("depth", "num_heads", "hidden_size", "intermediate_size"), _qwen3_extra, _QWEN3_EXPECTED,
        problems=_qwen3_problems, deepstack=True,
        fixups=(("visual.merger.linear_fc1.", "visual.merger.mlp.0."), ("visual.merger.linear_fc2.", "visual.merger.mlp.2."),
                ("visual.merger.norm.", "visual.merger.ln_q."))),
    "gemma3": MmprojLayout(
        "gemma3", (("model.vision_tower.vision_model.", "vision_tower.vision_model."),
                   ("model.vision_tower.", "vision_tower.vision_model."),
                   ("vision_tower.vision_model.", "vision_tower.vision_model."),
                   ("vision_tower.", "vision_tower.vision_model."),
                   ("model.multi_modal_projector.", "multi_modal_projector."),
                   ("multi_modal_projector.", "multi_modal_projector.")),
        _SIGLIP_DEPTH, _gemma3_extra,
        _siglip_expected("vision_tower.vision_model.", (
            ("multi_modal_projector.mm_input_projection.weight", ("mm.input_projection.weight",)),
            ("multi_modal_projector.mm_soft_emb_norm.weight", ("mm.soft_emb_norm.weight",)))),
        f32=(".embeddings.",), norm_shift=("multi_modal_projector.mm_soft_emb_norm.weight",), problems=_gelu_problems),
    "idefics3": MmprojLayout(
        "idefics3", (("model.vision_model.", "model.vision_model."), ("model.connector.", "model.connector.")),
        _SIGLIP_DEPTH, _smolvlm_extra,
        _siglip_expected("model.vision_model.", (
            ("model.connector.modality_projection.proj.weight", ("mm.model.fc.weight",)),)),
        f32=(".embeddings.",), problems=_gelu_problems),
}
assert {k for k, f in VISION_FAMILIES.items() if f.gguf_projector} == set(MMPROJ_LAYOUTS), \
    "vision_families.gguf_projector and MMPROJ_LAYOUTS must name the same families"
assert all(VISION_FAMILIES[k].gguf_projector == v.projector_type for k, v in MMPROJ_LAYOUTS.items())
