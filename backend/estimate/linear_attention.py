"""What one of Qwen3.5's Gated DeltaNet (linear-attention) blocks saves for backward, as the PyTorch
fallback of transformers 5.25 runs it (modeling_qwen3_5.py: causal_conv1d_fn, torch_chunk_gated_delta_rule,
Qwen3_5RMSNormGated), which is what runs without the causal-conv1d and flash-linear-attention kernels:
on every CPU, and on CUDA where those packages are not installed.

With flash-linear-attention on CUDA the chunked rule is one autograd Function (ChunkGatedDeltaRuleFunction,
fla-org/flash-linear-attention fla/ops/gated_delta_rule/chunk.py as read at 92396f2), which saves only the
l2-normalized q and k with their rstd, v, the cumulative gate g, beta and the solved 64-wide chunk matrix A
(k's dtype), and recomputes the recurrent states in backward; causal-conv1d's kernel has its own autograd
Function (not read here). Neither was measured, so a CUDA estimate counts the fallback's saves, more than
the kernels keep (chiefly the five fp32 C-wide matrices against fla's one A).
"""

from __future__ import annotations

from backend.estimate.architectures import Dims, Linear
from backend.estimate.saved import Saved, linear
from backend.estimate.setup import Setup

CHUNK = 64
"""torch_chunk_gated_delta_rule's chunk_size: the sequence is padded to a multiple of it."""


def linear_attention_saved(saved: Saved, dims: Dims, setup: Setup, lins: dict[str, Linear], n1_e: int,
                           input_grad: bool) -> tuple[int, bool]:
    """Saves of the linear-attention block after the input norm (its output under "n1"); returns the
    dtype bytes of out_proj's output and whether it needs a gradient. Measured term by term with the
    saved-tensor meter (tests/backend/test_estimate_qwen3_5.py), T tokens, P = B x the padded length,
    nv value heads (q and k are repeated to them), dk / dv head widths, C = 64:

    - the four input projections (saved.linear), the conv's input (q, k, v projected: T x conv_dim) and
      SiLU's input, the conv output with its kernel - 1 extra positions;
    - beta = sigmoid(b) (its output) and g = -exp(A_log) * softplus(a + dt_bias) (softplus' input, and
      its output when A_log trains): T x nv each;
    - in fp32: the q and k copies l2norm saves with their rsqrt; then, padded, q, k, v, beta, k * beta,
      the solved values and decayed keys, the decayed q and k (6 dk + 2 dv + 1 per token and head),
      five C-wide intra-chunk matrices (the pairwise decay, k_beta k^T and q k^T products, the UT
      system, the masked attention), three exp(cumulative decay) vectors, and per chunk the corrected
      values (dv per token and head) and the recurrent state (nv x dk x dv); when the length is a
      multiple of C (two chunks or more), four more dk-wide copies the matmuls make (measured at batch 1;
      at batch 2 and 3 there were fewer: the layer is then over by up to 1.8%); one chunk of
      exactly C tokens saves less than counted here (3.7% of the layer at the tiny widths);
    - the gated RMSNorm over each value head: its fp32 input and rsqrt, SiLU's input z, both factors of
      the gating product (and the normalized input when its weight trains), then out_proj's input.
    """
    T, B, S = setup.tokens, setup.batch, setup.seq
    e = setup.residual_bytes
    nv, dk, dv, K = dims.linear_v_heads, dims.linear_k_dim, dims.linear_v_dim, dims.conv_kernel
    cd, vd = dims.conv_dim, nv * dv
    padded = -(-S // CHUNK) * CHUNK
    P, chunks = B * padded, B * padded // CHUNK
    qkv_e = linear(saved, setup, lins["lin_qkv"], "n1", n1_e, input_grad)
    z_e = linear(saved, setup, lins["lin_z"], "n1", n1_e, input_grad)
    b_e = linear(saved, setup, lins["lin_b"], "n1", n1_e, input_grad)
    a_e = linear(saved, setup, lins["lin_a"], "n1", n1_e, input_grad)
    saved.put("conv_in", T * cd * qkv_e)
    saved.put("conv_out", B * (S + K - 1) * cd * qkv_e)
    saved.put("beta", T * nv * b_e)
    saved.put("softplus_in", T * nv * max(a_e, 4))
    if setup.full:  # the product with -exp(A_log) saves softplus' output only for A_log's gradient
        saved.put("softplus_out", T * nv * 4)
    saved.put("neg_exp_a", nv * 4)
    saved.put("l2norm_in", 2 * T * nv * dk * 4)
    saved.put("l2norm_rsqrt", 2 * T * nv * 4)
    saved.put("chunk_qkv", P * nv * (6 * dk + 2 * dv + 1) * 4)
    saved.put("chunk_square", 5 * P * nv * CHUNK * 4)
    if S % CHUNK == 0 and S > CHUNK:
        # no padding: F.pad hands back its input, and the two intra-chunk matmuls save contiguous
        # copies of k_beta and q and of k^T (twice) instead of views (measured at 128 and 192 tokens)
        saved.put("chunk_matmul_copies", 4 * P * nv * dk * 4)
    saved.put("chunk_decays", 3 * P * nv * 4 + chunks * nv * 4 + CHUNK * CHUNK)
    saved.put("chunk_v_new", P * nv * dv * 4)
    saved.put("chunk_states", chunks * nv * dk * dv * 4)
    saved.put("gnorm_x32", T * vd * 4)
    saved.put("gnorm_rstd", T * nv * 4)
    if setup.full:
        saved.put("gnorm_normed", T * vd * e)
    saved.put("gnorm_gate_in", T * vd * max(z_e, 4))
    saved.put("gnorm_weighted", T * vd * max(e, setup.weight_bytes))
    saved.put("gnorm_gate_out", T * vd * 4)
    out_e = linear(saved, setup, lins["lin_out"], "gnorm_out", max(e, setup.weight_bytes), True)
    return out_e, True
