"""What one attention block saves for backward: projections, q/k norms, rotary, the kernel, o_proj."""

from __future__ import annotations

from backend.estimate.architectures import Arch, Dims, Linear
from backend.estimate.saved import Saved, dropout, linear, norm
from backend.estimate.setup import Setup


def attention_kernel(dims: Dims, setup: Setup) -> str:
    """The kernel that actually runs: eager; flash (FlashAttention-2, SDPA's flash kernel on CUDA
    in bf16/fp16, SDPA's CPU kernel); efficient (SDPA on CUDA in fp32, which flash does not support);
    math (SDPA on CUDA in fp32 with grouped-query attention, which the efficient kernel does not
    support, and SDPA on the CPU with attention dropout, which its flash kernel does not support:
    torch falls back to the reference implementation, which saves the s x s probabilities like
    eager attention does; measured on an H200 and on the CPU)."""
    if setup.attention == "eager":
        return "eager"
    if setup.attention == "flash_attention_2":
        return "flash"
    if setup.device == "cpu":
        return "math" if dims.attn_dropout > 0 else "flash"
    if setup.compute_bytes != 4:
        return "flash"
    return "math" if dims.heads > dims.kv_heads else "efficient"


def sdpa_mask(dims: Dims, setup: Setup, layer_type: str) -> bool:
    """Whether SDPA gets a 4-D mask in this layer: a sliding-window layer whose window the sequence
    reaches (transformers skips the mask only below it), or any layer of a windowed model when packed
    rows bring restarting position ids (the packed-sequence mask; the worker's sdpa_packed hands
    windowed models to transformers' own masks)."""
    if setup.attention != "sdpa" or not dims.sliding_window:
        return False
    return setup.packing or (layer_type == "sliding_attention" and setup.seq >= dims.sliding_window)


def attention_saved(saved: Saved, arch: Arch, dims: Dims, setup: Setup, lins: dict[str, Linear], n1_e: int,
                    input_grad: bool, layer_type: str) -> tuple[int, bool]:
    """Saves of the attention block after the input norm (its output under the key "n1"); returns
    the dtype bytes of o_proj's output and whether that output needs a gradient.

    - rotary: q*cos and rotate_half(q)*sin save only cos/sin (model-wide, counted once), since cos
      and sin need no gradient; the rotated q and k are new tensors. q/k norms (Qwen3, Gemma 3) save
      their fp32 input and rsqrt per head.
    - eager attention: matmul saves the rotated q and k (k repeated to all heads when
      num_key_value_heads < num_attention_heads; GPT-2's q and k are views of c_attn's output, which
      they keep alive whole for one row, or copies for several), softmax saves its fp32 output
      (B*heads*S*S*4, the 5as/h term of Korthikanti et al.; GPT-2's runs in the input dtype), plus a
      copy in the compute dtype when that is not fp32, and the second matmul saves that and V
      (repeated for GQA, else a view that keeps the whole V or fused-QKV projection output alive).
      Gemma 2's logit soft-capping saves tanh's S x S output; attention dropout its S x S mask
      and the dropped probabilities.
    - SDPA / FlashAttention-2: q, k, v (not repeated), the output and a fp32 log-sum-exp per query and
      head; o_proj reads the output itself when the query kept the projection's memory layout, else
      a contiguous copy. With a 4-D mask (sliding windows) transformers repeats k and v for GQA and
      torch saves the mask converted to the query's dtype, per layer.
    - dtypes follow type promotion (fp32 hidden states times bf16 projections give fp32) and, under
      autocast, every matmul/linear/SDPA input that is not in the compute dtype is saved as a cast
      copy instead.
    """
    T, c, B, S = setup.tokens, setup.compute_bytes, setup.batch, setup.seq
    x_e = setup.residual_bytes

    def fed(key: str, src_e: int, numel: int, own: int | None = None, cast_key: str | None = None) -> None:
        """A tensor saved by an op that autocast runs in the compute dtype: a cast copy if needed
        (of the `own` elements of a view, which otherwise keeps its whole storage of `numel`)."""
        if setup.autocast and src_e != c:
            saved.put(cast_key or f"{key}_c", (numel if own is None else own) * c)
        else:
            saved.put(key, numel * src_e)

    def needs(role: str) -> bool:
        """Whether q, k or v needs a gradient: always, except in a LoRA model's first layer (whose
        input comes from a frozen embedding) where only the adapted projections do."""
        return input_grad or setup.full or role in setup.targets or "qkv" in setup.targets

    q_grad, k_grad, v_grad = needs("q"), needs("k"), needs("v")
    if arch.fused_qkv:
        qkv_e = linear(saved, setup, lins["qkv"], "n1", n1_e, input_grad)
        q_e = k_e = v_e = qkv_e
        out_numel = T * (dims.q_dim + 2 * dims.kv_dim)
        q_key = k_key = v_key = "qkv_out"
        q_numel = k_numel = v_numel = out_numel
    else:
        q_e = linear(saved, setup, lins["q"], "n1", n1_e, input_grad)
        k_e = linear(saved, setup, lins["k"], "n1", n1_e, input_grad)
        v_e = linear(saved, setup, lins["v"], "n1", n1_e, input_grad)
        q_key, k_key, v_key = "q_out", "k_out", "v_out"
        q_numel, k_numel, v_numel = T * dims.q_dim, T * dims.kv_dim, T * dims.kv_dim
    if arch.attn_output_gate and q_e == 4:
        # Qwen3.5: q_norm reads a strided view of q_proj's output (query and gate side by side), which
        # keeps the whole 2 x q_dim storage alive (a bf16 output is upcast: a fresh q_dim-wide copy)
        saved.put(q_key, T * 2 * dims.q_dim * q_e)
    if arch.qk_norm:
        q_e = norm(saved, arch.norm, setup, "q_norm", q_key, q_e, q_grad, dims.head_dim, T * dims.heads)
        k_e = norm(saved, arch.norm, setup, "k_norm", k_key, k_e, k_grad, dims.head_dim, T * dims.kv_heads)
    if dims.rotary_dim:
        # Rotary embeddings multiply by cos/sin in the hidden states' dtype (type promotion).
        qr_e, kr_e = max(q_e, x_e), max(k_e, x_e)
        q_src, k_src = ("q_rot", T * dims.q_dim), ("k_rot", T * dims.kv_dim)
    else:
        # GPT-2: q and k are views of c_attn's output; bmm copies them for more than one row.
        qr_e, kr_e = q_e, k_e
        q_src = (q_key, q_numel) if B == 1 else ("q_copy", T * dims.q_dim)
        k_src = (k_key, k_numel) if B == 1 else ("k_copy", T * dims.kv_dim)
    groups = max(1, dims.heads // dims.kv_heads)
    # transformers' repeat_kv is expand + reshape: with one KV head and one row the reshape and the
    # matmul's batch folding stay views (stride 0 over the heads), so eager attention keeps the rotated
    # k and v, not copies per head (measured on the tiny Qwen3.5, one KV head of four; two rows copy)
    copies = groups if dims.kv_heads > 1 or B > 1 else 1
    kernel = attention_kernel(dims, setup)
    masked = kernel != "eager" and sdpa_mask(dims, setup, layer_type)
    scores_grad = q_grad or k_grad
    rows, length = setup.attn_rows  # per example for a packed row cut by the kernel
    probs = rows * dims.heads * length * length
    if kernel == "math":
        # torch's reference kernel: q and k times sqrt(scale) (k repeated for GQA), its softmax,
        # dropout, and V; on the CPU it upcasts bf16/fp16 inputs to fp32 first.
        me = 4 if setup.device == "cpu" else (c if setup.autocast else qr_e)
        kv_numel = T * (dims.q_dim if groups > 1 else dims.kv_dim)
        if k_grad:
            saved.put("q_scaled", T * dims.q_dim * me)
        if q_grad:
            saved.put("k_scaled", kv_numel * me)
        if scores_grad:
            saved.put("probs_sm", probs * me)
        p_key = "probs_sm"
        if dims.attn_dropout > 0:
            dropout(saved, setup, "attn_dropout", dims.attn_dropout, probs, me, scores_grad)
            p_key = "probs_dropped"
        if v_grad:
            saved.put(p_key, probs * me)
        if scores_grad:
            if groups > 1 or me != v_e or (arch.fused_qkv and B > 1) or (setup.autocast and v_e != c):
                saved.put("v_math", kv_numel * me)
            else:
                saved.put(v_key, v_numel * v_e)
        o_in, o_e = "attn_out", (c if setup.autocast else qr_e)
    elif kernel == "eager":
        # scores = q @ k^T saves each side only if the other needs a gradient; softmax saves its
        # output if the scores need one; probs @ v saves probs if v needs one and v if probs do.
        if k_grad:
            fed(q_src[0], qr_e, q_src[1], T * dims.q_dim, "q_c")
        if q_grad:
            if copies > 1:
                fed("k_rep", kr_e, T * dims.q_dim)
            else:
                fed(k_src[0], kr_e, k_src[1], T * dims.kv_dim, "k_c")
        scores_e = c if setup.autocast else qr_e
        if dims.attn_softcap and scores_grad:
            saved.put("softcap_tanh", probs * scores_e)
        if arch.eager_softmax_fp32:
            sm_key, sm_e = "probs32", 4
            probs_e = c if setup.autocast else qr_e  # softmax(..., dtype=float32).to(query.dtype)
        else:
            # GPT-2: softmax in the scores' dtype (fp32 under autocast), then .type(value.dtype)
            sm_key, sm_e, probs_e = "probs_sm", (4 if setup.autocast else scores_e), v_e
        if scores_grad:
            saved.put(sm_key, probs * sm_e)
        p_key = sm_key if probs_e == sm_e else "probs"
        if dims.attn_dropout > 0:
            dropout(saved, setup, "attn_dropout", dims.attn_dropout, probs, probs_e, scores_grad)
            p_key = "probs_dropped"
        if v_grad:
            fed(p_key, probs_e, probs)
        if scores_grad:
            if copies > 1:
                fed("v_rep", v_e, T * dims.q_dim)
            elif arch.fused_qkv and B > 1:
                # bmm needs (B*heads, S, dim): a strided view of the fused output is copied
                fed("v_copy", v_e, T * dims.kv_dim)
            elif setup.autocast and v_e != c:
                saved.put("v_c", T * dims.kv_dim * c)
            else:
                # a view: it keeps the whole projection output (all of QKV when fused) alive
                saved.put(v_key, v_numel * v_e)
        o_in, o_e = "attn_out", (c if setup.autocast else (v_e if not dims.rotary_dim else qr_e))
    else:
        if masked and groups > 1:
            fed("q_rot" if dims.rotary_dim else q_src[0], qr_e, T * dims.q_dim if dims.rotary_dim else q_src[1])
            fed("k_rep", kr_e, T * dims.q_dim)
            fed("v_rep", v_e, T * dims.q_dim)
        else:
            fed(q_src[0], qr_e, q_src[1])
            fed(k_src[0], kr_e, k_src[1])
            if setup.autocast and v_e != c:
                saved.put("v_c", T * dims.kv_dim * c)
            else:
                saved.put(v_key, v_numel * v_e)
        o_e = c if setup.autocast else qr_e
        if masked:
            saved.put("sdpa_mask", B * S * S * o_e)
        if kernel == "efficient" or (masked and setup.device == "cuda"):
            # CUDA's memory-efficient kernel pads the log-sum-exp to 32 queries and writes its
            # output in (B, S, heads, dim) layout, which o_proj then reads without a copy.
            saved.put("lse", rows * dims.heads * (-(-length // 32) * 32) * 4)
            saved.put("sdpa_out", T * dims.q_dim * o_e)
            o_in = "sdpa_out"
        else:
            saved.put("lse", B * dims.heads * S * 4)
            saved.put("sdpa_out", T * dims.q_dim * o_e)
            # sdpa_packed joins several examples' outputs with one cat: o_proj reads that copy
            per_example_cat = bool(setup.example_len) and rows > 1
            o_in = "sdpa_out" if arch.query_layout_bshd and not per_example_cat else "attn_out"
    if arch.attn_output_gate:
        # attn_output * sigmoid(gate): the product saves both factors (the attention output as a
        # contiguous copy in (B, S, heads x dim)) and o_proj reads the product
        saved.put("attn_out", T * dims.q_dim * o_e)
        saved.put("gate_sigmoid", T * dims.q_dim * q_e)
        o_in, o_e = "attn_gated", max(o_e, q_e)
    o_out_e = linear(saved, setup, lins["o"], o_in, o_e, True)
    out_grad = input_grad or setup.full or bool(setup.targets & {"q", "k", "v", "qkv", "o"})
    dropout(saved, setup, "attn_resid_dropout", dims.resid_dropout, T * dims.hidden, o_out_e, out_grad)
    return o_out_e, out_grad
