"""Activations saved for backward, layer by layer (see backend.estimate's docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any

from backend.estimate.architectures import Arch, Dims, LayerKind, Linear, layer_kinds
from backend.estimate.attention import attention_kernel, attention_saved, sdpa_mask
from backend.estimate.linear_attention import linear_attention_saved
from backend.estimate.mlp import dense_mlp_saved, moe_saved
from backend.estimate.saved import Saved, dropout, linear, norm
from backend.estimate.setup import Setup

__all__ = ["activation_bytes", "attention_kernel"]

PERSISTENT = ("rotary_cos_sin", "input_ids", "position_ids", "labels", "embd_dropout")
"""Model-level saved tensors that live until the embedding's backward (the final norm's and
lm_head's are freed before the first checkpointed layer is recomputed)."""


def _layer_saved(arch: Arch, dims: Dims, setup: Setup, kind: LayerKind, input_grad: bool, layer_type: str) -> Saved:
    """Every storage one decoder layer saves for backward, by name (bytes), following the Hugging Face
    implementations op by op (measured in bench/estimate_accuracy.py): the input norm, attention
    (attention.py), Gemma's norm of the attention output, the second norm (on the layer input for
    GPT-NeoX's parallel residual, else on input + attention output), the MLP or the mixture of
    experts (mlp.py), and Gemma's norm of the MLP output. Norms: see saved.norm; linears: saved.linear.
    """
    saved = Saved()
    lins = {lin.role: lin for lin in kind.linears}
    x_e = setup.residual_bytes
    n1_e = norm(saved, arch.norm, setup, "norm1", "x_in", x_e, input_grad, dims.hidden)
    if kind.mixer == "linear_attention":
        o_e, attn_grad = linear_attention_saved(saved, dims, setup, lins, n1_e, input_grad)
    else:
        o_e, attn_grad = attention_saved(saved, arch, dims, setup, lins, n1_e, input_grad, layer_type)
    if arch.sandwich_norms:
        o_e = norm(saved, arch.norm, setup, "post_attn_norm", "attn_o", o_e, attn_grad, dims.hidden)
    if dims.parallel_residual:
        n2_e = norm(saved, arch.norm, setup, "norm2", "x_in", x_e, input_grad, dims.hidden)
        mlp_in_grad = True
    else:
        n2_e = norm(saved, arch.norm, setup, "norm2", "resid1", max(x_e, o_e), attn_grad, dims.hidden)
        mlp_in_grad = attn_grad
    if kind.moe:
        out_e = moe_saved(saved, arch, dims, setup, lins, "n2", n2_e, mlp_in_grad)
    else:
        out_e = dense_mlp_saved(saved, arch, dims, setup, lins, "n2", n2_e, mlp_in_grad, dims.intermediate)
    if arch.sandwich_norms:
        norm(saved, arch.norm, setup, "post_ff_norm", "mlp_out", out_e, True, dims.hidden)
    return saved


def _layer_plan(arch: Arch, dims: Dims) -> list[tuple[LayerKind, str]]:
    """(kind, attention type) of every decoder layer, in order."""
    kinds = {(k.moe, k.mixer): k for k in layer_kinds(arch, dims)}
    plan = []
    for i in range(dims.layers):
        moe = bool(dims.sparse_layers[i]) if dims.sparse_layers else False
        layer_type = dims.layer_types[i] if dims.layer_types else "full_attention"
        mixer = "linear_attention" if layer_type == "linear_attention" else "attention"
        plan.append((kinds[(moe, mixer)], layer_type))
    return plan


def _model_level(arch: Arch, dims: Dims, setup: Setup) -> Saved:
    """Saved outside the decoder layers: rotary cos/sin ((1, S, rotary_dim) each in the hidden states'
    dtype, shared by the batch and by every layer; one pair per rotary set, Gemma 3 has a local and
    a global one), token ids (trained embeddings), labels, GPT-2's embedding dropout mask, the final
    norm and lm_head's input."""
    T, residual_bytes = setup.tokens, setup.residual_bytes
    model = Saved()
    if dims.rotary_dim:
        sets = len(set(dims.layer_types)) if arch.family == "gemma3_text" and dims.layer_types else 1
        model.put("rotary_cos_sin", sets * 2 * setup.seq * dims.rotary_dim * residual_bytes)
    if setup.full:
        model.put("input_ids", T * 8)
        if dims.positions:
            model.put("position_ids", setup.seq * 8)
    model.put("labels", T * 8)
    dropout(model, setup, "embd_dropout", dims.embd_dropout, T * dims.hidden, residual_bytes, setup.full or setup.checkpointing)
    final_e = norm(model, arch.norm, setup, "final_norm", "x_final", residual_bytes, True, dims.hidden)
    lm_head = Linear("lm_head", "lm_head", dims.hidden, dims.vocab, False)
    linear(model, setup, lm_head, "final_out", final_e, True)
    return model


def _checkpoint_kwargs(arch: Arch, dims: Dims, setup: Setup, plan: list[tuple[LayerKind, str]]) -> int:
    """Keyword inputs the non-reentrant checkpoint keeps in its closure for the recompute: the
    position ids, and the 4-D masks (eager: one float mask per attention type, in the hidden
    states' dtype; SDPA: the bool masks of windowed layers)."""
    extra = setup.tokens * 8
    types = sorted({t for _, t in plan if t != "linear_attention"})  # Gated DeltaNet takes no 4-D mask
    if setup.attention == "eager" or not arch.sdpa:
        extra += len(types) * setup.batch * setup.seq * setup.seq * setup.residual_bytes
    else:
        extra += sum(setup.batch * setup.seq * setup.seq for t in types if sdpa_mask(dims, setup, t))
    return extra


def _activations(arch: Arch, dims: Dims, setup: Setup) -> dict[str, Any]:
    T = setup.tokens
    plan = _layer_plan(arch, dims)
    cache: dict[tuple[bool, str, bool], Saved] = {}

    def layer(kind: LayerKind, layer_type: str, grad: bool) -> Saved:
        key = (kind.moe, layer_type, grad)
        if key not in cache:
            cache[key] = _layer_saved(arch, dims, setup, kind, grad, layer_type)
        return cache[key]

    # Without checkpointing, a frozen embedding gives layer 0 an input that needs no gradient, so
    # its first norm saves nothing (LoRA); checkpointing makes the input require grad (HF's
    # enable_input_require_grads).
    first_grad = setup.full or setup.checkpointing
    per_layer_all = [layer(k, t, True if i else first_grad).total() for i, (k, t) in enumerate(plan)]
    full_layers = [layer(k, t, True) for k, t in plan]
    biggest = max(full_layers, key=lambda sv: sv.total())
    layer_input = T * dims.hidden * setup.residual_bytes
    model = _model_level(arch, dims, setup)
    model_level = model.total()

    kept = extra_inputs = recompute = 0
    if not setup.checkpointing:
        total = sum(per_layer_all) + model_level
    else:
        kept = dims.layers * layer_input
        extra_inputs = _checkpoint_kwargs(arch, dims, setup, plan)
        recompute = max(sv.total(without={"x_in"}) for sv in full_layers)
        # bitsandbytes' int8 matmul keeps its input as a ctx attribute, out of reach of the
        # checkpoint's saved-tensor hooks: every layer keeps those inputs anyway.
        kept += sum(sum(v for k, v in sv.items.items() if k in sv.ctx_held and k != "x_in") for sv in full_layers)
        total = kept + extra_inputs + recompute + model_level
    kernel = attention_kernel(dims, setup)
    e = setup.compute_bytes
    with_scores = kernel in ("eager", "math")
    rows, length = setup.attn_rows
    eager_scores = rows * dims.heads * length * length * (4 + (e if e != 4 else 0)) if with_scores else 0
    return {
        "total": total,
        "per_layer": biggest.total(),
        "per_layer_items": dict(biggest.items),
        "first_layer": per_layer_all[0],
        "layer_input": layer_input,
        "attention_scores_per_layer": eager_scores,
        "model_level": model_level,
        "model_level_items": dict(model.items),
        "model_level_persistent": sum(v for k, v in model.items.items() if k.startswith(PERSISTENT)),
        "checkpointed_inputs": kept,
        "checkpoint_extra_inputs": extra_inputs,
        "recompute_one_layer": recompute,
    }


def activation_bytes(arch: Arch, dims: Dims, setup: Setup) -> dict[str, Any]:
    """Saved activations of the whole model and their pieces (see `_layer_saved`), with the totals
    with and without checkpointing side by side.

    Without checkpointing: every layer's saved tensors + the model-level ones (rotary cos/sin, the
    final norm, lm_head's input if trained, token ids and labels). With it (non-reentrant, every
    layer): each layer's input (B*S*hidden) and keyword inputs (position ids, eager's 4-D mask),
    plus one layer's saved tensors while it is recomputed in the backward pass, plus the same
    model-level tensors.
    """
    own = _activations(arch, dims, setup)
    other = _activations(arch, dims, dataclasses.replace(setup, checkpointing=not setup.checkpointing))
    own["with_checkpointing"] = own["total"] if setup.checkpointing else other["total"]
    own["without_checkpointing"] = other["total"] if setup.checkpointing else own["total"]
    return own
