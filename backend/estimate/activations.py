"""Activations saved for backward, layer by layer (see backend.estimate's docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any

from backend.estimate.architectures import Arch, Dims, Linear, layer_linears
from backend.estimate.setup import Setup


class _Saved:
    """Named storages saved for backward; a name saved twice is one storage (counted once)."""

    def __init__(self) -> None:
        self.items: dict[str, int] = {}
        self.ctx_held: set[str] = set()
        """Keys a custom autograd Function keeps as a ctx attribute (bitsandbytes' int8 matmul), which
        activation checkpointing cannot drop."""

    def put(self, key: str, nbytes: int) -> None:
        self.items.setdefault(key, int(nbytes))

    def total(self, without: set[str] | None = None) -> int:
        return sum(v for k, v in self.items.items() if not without or k not in without)


def _linear(saved: _Saved, s: Setup, lin: Linear, inp_key: str, inp_e: int, inp_grad: bool) -> int:
    """What one linear saves; returns its output's bytes per element.

    A trained weight needs its input (dW = dY^T X); a frozen one needs only itself (a parameter).
    Under autocast the input is first cast to the compute dtype (a copy per linear, saved instead
    of the shared input) and so is a weight of another dtype (the cast copy, saved when the input
    needs a gradient: 2 bytes per parameter held through the backward pass). bitsandbytes' 4-bit
    matmul saves nothing but its weight and returns the input's dtype; its 8-bit training path on the
    CPU (MatMul8bitFp) keeps its input as a ctx attribute, always, even under checkpointing; on CUDA
    (H200, bitsandbytes 0.50.2) the 8-bit linears were measured to add no saved activations.

    An adapter saves its input (a copy in the adapter's dtype when that differs from the compute
    dtype, or under autocast a copy in the compute dtype, one per adapted linear) and the r-wide A
    output; under autocast also the compute-dtype copies of A and B. LoRA dropout adds its mask
    (bool on CUDA, the input's dtype on CPU). DoRA also saves the base output and the LoRA output
    (out wide each) and three out-sized vectors."""
    T, c = s.tokens, s.e
    quantized = s.quant is not None and lin.role != "lm_head"
    if s.full:
        if s.autocast and inp_e != c:
            saved.put(f"{lin.name}.in_c", T * lin.inp * c)
        else:
            saved.put(inp_key, T * lin.inp * inp_e)
        if s.autocast and s.w_e != c and inp_grad:
            saved.put(f"{lin.name}.weight_c", lin.inp * lin.out * c)
        out_e = c if s.autocast else s.w_e
    elif quantized:
        out_e = inp_e
        if s.quant == "int8" and s.device == "cpu":
            saved.put(inp_key, T * lin.inp * inp_e)
            saved.ctx_held.add(inp_key)
            out_e = c if s.autocast else inp_e  # MatMul8bitFp dequantizes and calls F.linear
    else:
        if s.autocast and s.w_e != c and inp_grad:
            saved.put(f"{lin.name}.weight_c", lin.inp * lin.out * c)
        out_e = c if s.autocast else s.w_e
    if lin.role in s.targets:
        ae = s.adapter_e
        mask_e = 1 if s.device == "cuda" else ae
        if s.autocast:
            if s.dropout and inp_grad:
                saved.put(f"{lin.name}.dropout_mask", T * lin.inp * mask_e)
            saved.put(f"{lin.name}.in_c", T * lin.inp * c)
            saved.put(f"{lin.name}.lora_mid", T * s.rank * c)
            if inp_grad:
                saved.put(f"{lin.name}.lora_A_c", s.rank * lin.inp * c)
            saved.put(f"{lin.name}.lora_B_c", lin.out * s.rank * c)
            adapter_out_e = c
        else:
            if s.dropout:
                # the dropped copy feeds lora_A (the mask only when the input needs a gradient)
                saved.put(f"{lin.name}.dropout_in", T * lin.inp * ae)
                if inp_grad:
                    saved.put(f"{lin.name}.dropout_mask", T * lin.inp * mask_e)
            elif ae == inp_e:
                saved.put(inp_key, T * lin.inp * inp_e)
            else:
                saved.put(f"{lin.name}.in_{ae}", T * lin.inp * ae)
            saved.put(f"{lin.name}.lora_mid", T * s.rank * ae)
            adapter_out_e = ae
        if s.method == "dora":
            saved.put(f"{lin.name}.dora_base", T * lin.out * out_e)
            saved.put(f"{lin.name}.dora_lora", T * lin.out * adapter_out_e)
            saved.put(f"{lin.name}.dora_vectors", 3 * lin.out * 4)
    return out_e


def _norm(saved: _Saved, arch: Arch, d: Dims, s: Setup, name: str, x_key: str, x_e: int, x_grad: bool) -> int:
    """What a norm saves; returns its output's bytes per element.

    RMSNorm (HF): upcasts x to fp32 and saves it (x itself when already fp32), saves rsqrt (one
    fp32 per token) and, when its weight is trained, the normalized x in x's dtype; the output takes
    the wider of the weight's and x's dtypes. LayerNorm (native_layer_norm): saves x and a mean and
    rstd per token (fp32 on CUDA, x's dtype on CPU); under CUDA autocast it runs in fp32 (x is
    upcast, a saved copy, and the output is fp32)."""
    T = s.tokens
    if arch.norm == "rms":
        if x_grad:
            saved.put(x_key if x_e == 4 else f"{name}.x32", T * d.hidden * 4)
            saved.put(f"{name}.rstd", T * 4)
        if s.full:
            saved.put(f"{name}.normed", T * d.hidden * x_e)
        return max(s.w_e, x_e)
    if not (x_grad or s.full):
        return max(s.w_e, x_e) if not (s.autocast and s.device == "cuda") else 4
    if s.autocast and s.device == "cuda":
        saved.put(x_key if x_e == 4 else f"{name}.x32", T * d.hidden * 4)
        saved.put(f"{name}.stats", 2 * T * 4)
        return 4
    saved.put(x_key, T * d.hidden * x_e)
    saved.put(f"{name}.stats", 2 * T * (4 if s.device == "cuda" else x_e))
    return max(s.w_e, x_e)


def attention_kernel(d: Dims, s: Setup) -> str:
    """The kernel that actually runs: eager; flash (FlashAttention-2, SDPA's flash kernel on CUDA
    in bf16/fp16, SDPA's CPU kernel); efficient (SDPA on CUDA in fp32, which flash does not support);
    math (SDPA on CUDA in fp32 with grouped-query attention, which the efficient kernel does not
    support: torch falls back to the reference implementation, which saves the s x s probabilities
    like eager attention does; measured on an H200)."""
    if s.attention == "eager":
        return "eager"
    if s.attention == "flash_attention_2" or s.device == "cpu" or s.e != 4:
        return "flash"
    return "math" if d.heads > d.kv_heads else "efficient"


def _layer_saved(arch: Arch, d: Dims, s: Setup, input_grad: bool) -> _Saved:
    """Every storage one decoder layer saves for backward, by name (bytes), following the Hugging Face
    implementations op by op (measured in bench/estimate_accuracy.py):

    - norms: see `_norm`; linears: see `_linear`.
    - rotary: q*cos and rotate_half(q)*sin save only cos/sin (model-wide, counted once), since cos
      and sin need no gradient; the rotated q and k are new tensors.
    - eager attention: matmul saves the rotated q and k (k repeated to all heads when
      num_key_value_heads < num_attention_heads), softmax saves its fp32 output (B*heads*S*S*4, the
      5as/h term of Korthikanti et al.), plus a copy in the compute dtype when that is not fp32, and
      the second matmul saves that and V (repeated for GQA, else a view that keeps the whole V or
      fused-QKV projection output alive).
    - SDPA / FlashAttention-2: q, k, v (not repeated), the output and a fp32 log-sum-exp per query and
      head; o_proj reads the output itself when the query kept the projection's memory layout, else
      a contiguous copy.
    - gated MLP: the activation saves the gate output, the product saves the activation and the up
      output, down_proj (if trained) the product: 4 x intermediate per token. GELU MLP: fc1 output,
      and fc2's input (if trained).
    - dtypes follow type promotion (fp32 hidden states times bf16 projections give fp32) and, under
      autocast, every matmul/linear/SDPA input that is not in the compute dtype is saved as a cast
      copy instead.
    """
    T, c, B, S = s.tokens, s.e, s.batch, s.seq
    saved = _Saved()
    lins = {l.role: l for l in layer_linears(arch, d)}
    grad_from_attn = input_grad or bool(s.targets & {"q", "k", "v", "qkv", "o"}) or s.full

    def fed(key: str, src_e: int, numel: int) -> None:
        """A tensor saved by an op that autocast runs in the compute dtype: a cast copy if needed."""
        if s.autocast and src_e != c:
            saved.put(f"{key}_c", numel * c)
        else:
            saved.put(key, numel * src_e)

    x_e = s.r_e
    n1_e = _norm(saved, arch, d, s, "norm1", "x_in", x_e, input_grad)
    if arch.fused_qkv:
        qkv_e = _linear(saved, s, lins["qkv"], "n1", n1_e, input_grad)
        q_e = k_e = v_e = qkv_e
        v_key, v_numel = "qkv_out", T * (d.q_dim + 2 * d.kv_dim)
    else:
        q_e = _linear(saved, s, lins["q"], "n1", n1_e, input_grad)
        k_e = _linear(saved, s, lins["k"], "n1", n1_e, input_grad)
        v_e = _linear(saved, s, lins["v"], "n1", n1_e, input_grad)
        v_key, v_numel = "v_out", T * d.kv_dim
    # Rotary embeddings multiply by cos/sin in the hidden states' dtype (type promotion).
    qr_e, kr_e = max(q_e, x_e), max(k_e, x_e)

    # Which of q, k, v need a gradient: all of them, except in a LoRA model's first layer (whose
    # input comes from a frozen embedding) where only the adapted projections do.
    def needs(role: str) -> bool:
        return input_grad or s.full or role in s.targets or "qkv" in s.targets

    q_grad, k_grad, v_grad = needs("q"), needs("k"), needs("v")
    groups = max(1, d.heads // d.kv_heads)
    kernel = attention_kernel(d, s)
    if kernel in ("eager", "math"):
        # scores = q @ k^T saves each side only if the other needs a gradient; softmax saves its
        # output if the scores need one; probs @ v saves probs if v needs one and v if probs do.
        scores_grad = q_grad or k_grad
        if k_grad:
            fed("q_rot", qr_e, T * d.q_dim)
        if q_grad:
            if groups > 1:
                fed("k_rep", kr_e, T * d.q_dim)
            else:
                fed("k_rot", kr_e, T * d.kv_dim)
        if scores_grad:
            saved.put("probs32", B * d.heads * S * S * 4)
        if v_grad:
            # softmax(..., dtype=float32).to(query.dtype), then cast again by autocast if needed
            probs_e = c if s.autocast else qr_e
            saved.put("probs32" if probs_e == 4 else "probs", B * d.heads * S * S * probs_e)
        if scores_grad:
            if groups > 1:
                fed("v_rep", v_e, T * d.q_dim)
            elif arch.fused_qkv and B > 1:
                # bmm needs (B*heads, S, dim): a strided view of the fused output is copied
                fed("v_copy", v_e, T * d.kv_dim)
            elif s.autocast and v_e != c:
                saved.put("v_c", T * d.kv_dim * c)
            else:
                # a view: it keeps the whole projection output (all of QKV when fused) alive
                saved.put(v_key, v_numel * v_e)
        o_in, o_e = "attn_out", (c if s.autocast else qr_e)
    else:
        fed("q_rot", qr_e, T * d.q_dim)
        fed("k_rot", kr_e, T * d.kv_dim)
        if s.autocast and v_e != c:
            saved.put("v_c", T * d.kv_dim * c)
        else:
            saved.put(v_key, v_numel * v_e)
        o_e = c if s.autocast else qr_e
        if kernel == "efficient":
            # CUDA's memory-efficient kernel pads the log-sum-exp to 32 queries and writes its
            # output in (B, S, heads, dim) layout, which o_proj then reads without a copy.
            saved.put("lse", B * d.heads * (-(-S // 32) * 32) * 4)
            saved.put("sdpa_out", T * d.q_dim * o_e)
            o_in = "sdpa_out"
        else:
            saved.put("lse", B * d.heads * S * 4)
            saved.put("sdpa_out", T * d.q_dim * o_e)
            o_in = "sdpa_out" if arch.query_layout_bshd else "attn_out"
    o_out_e = _linear(saved, s, lins["o"], o_in, o_e, True)

    # Second norm: on the layer input (parallel residual) or on input + attention output.
    if d.parallel_residual:
        n2_e = _norm(saved, arch, d, s, "norm2", "x_in", x_e, input_grad)
        mlp_in_grad = True
    else:
        n2_e = _norm(saved, arch, d, s, "norm2", "resid1", max(x_e, o_out_e), grad_from_attn)
        mlp_in_grad = grad_from_attn
    i = d.intermediate
    if arch.gated_mlp:
        if arch.fused_gate_up:
            g_e = u_e = _linear(saved, s, lins["gate_up"], "n2", n2_e, mlp_in_grad)
            saved.put("gate_up_out", T * 2 * i * g_e)
        else:
            g_e = _linear(saved, s, lins["gate"], "n2", n2_e, mlp_in_grad)
            u_e = _linear(saved, s, lins["up"], "n2", n2_e, mlp_in_grad)
            saved.put("gate_out", T * i * g_e)
            saved.put("up_out", T * i * u_e)
        saved.put("act_out", T * i * g_e)
        _linear(saved, s, lins["down"], "prod", max(g_e, u_e), True)
    else:
        g_e = _linear(saved, s, lins["fc1"], "n2", n2_e, mlp_in_grad)
        saved.put("fc1_out", T * i * g_e)
        _linear(saved, s, lins["fc2"], "act_out", g_e, True)
    return saved


def _activations(arch: Arch, d: Dims, s: Setup) -> dict[str, Any]:
    T, e = s.tokens, s.e
    full_layer = _layer_saved(arch, d, s, input_grad=True)
    # Without checkpointing, a frozen embedding gives layer 0 an input that needs no gradient, so
    # its first norm saves nothing (LoRA); checkpointing makes the input require grad (HF's
    # enable_input_require_grads).
    first_grad = s.full or s.checkpointing
    first_layer = full_layer if first_grad else _layer_saved(arch, d, s, input_grad=False)
    per_layer = full_layer.total()
    r_e = s.r_e
    layer_input = T * d.hidden * r_e

    model = _Saved()
    # cos and sin: (1, S, rotary_dim) each in the hidden states' dtype, shared by the batch and by
    # every layer.
    model.put("rotary_cos_sin", 2 * s.seq * d.rotary_dim * r_e)
    if s.full:
        model.put("input_ids", T * 8)
    model.put("labels", T * 8)
    final_e = _norm(model, arch, d, s, "final_norm", "x_final", r_e, True)
    lm_head = Linear("lm_head", "lm_head", d.hidden, d.vocab, False)
    _linear(model, s, lm_head, "final_out", final_e, True)
    model_level = model.total()

    kept = extra_inputs = recompute = 0
    if not s.checkpointing:
        total = first_layer.total() + per_layer * (d.layers - 1) + model_level
    else:
        kept = d.layers * layer_input
        extra_inputs = T * 8  # position ids, kept by the checkpoint's closure
        if s.attention == "eager":
            extra_inputs += s.batch * s.seq * s.seq * r_e  # the 4-D causal mask, kept the same way
        recompute = full_layer.total(without={"x_in"})
        # bitsandbytes' int8 matmul keeps its input as a ctx attribute, out of reach of the
        # checkpoint's saved-tensor hooks: every layer keeps those inputs anyway.
        ctx_held = sum(v for k, v in full_layer.items.items() if k in full_layer.ctx_held and k != "x_in")
        kept += d.layers * ctx_held
        total = kept + extra_inputs + recompute + model_level
    with_scores = attention_kernel(d, s) in ("eager", "math")
    eager_scores = s.batch * d.heads * s.seq * s.seq * (4 + (e if e != 4 else 0)) if with_scores else 0
    return {
        "total": total,
        "per_layer": per_layer,
        "per_layer_items": dict(full_layer.items),
        "first_layer": first_layer.total(),
        "layer_input": layer_input,
        "attention_scores_per_layer": eager_scores,
        "model_level": model_level,
        "model_level_items": dict(model.items),
        "checkpointed_inputs": kept,
        "checkpoint_extra_inputs": extra_inputs,
        "recompute_one_layer": recompute,
    }


def activation_bytes(arch: Arch, d: Dims, s: Setup) -> dict[str, Any]:
    """Saved activations of the whole model and their pieces (see `_layer_saved`), with the totals
    with and without checkpointing side by side.

    Without checkpointing: every layer's saved tensors + the model-level ones (rotary cos/sin, the
    final norm, lm_head's input if trained, token ids and labels). With it (non-reentrant, every
    layer): each layer's input (B*S*hidden) and keyword inputs (position ids, eager's 4-D mask),
    plus one layer's saved tensors while it is recomputed in the backward pass, plus the same
    model-level tensors.
    """
    own = _activations(arch, d, s)
    other = _activations(arch, d, dataclasses.replace(s, checkpointing=not s.checkpointing))
    own["with_checkpointing"] = own["total"] if s.checkpointing else other["total"]
    own["without_checkpointing"] = other["total"] if s.checkpointing else own["total"]
    return own
