"""What one MLP block saves for backward: the dense MLP (gated, fused or GELU) and the mixture of experts."""

from __future__ import annotations

from backend.estimate.architectures import Arch, Dims, Linear
from backend.estimate.saved import Saved, activation, dropout, linear
from backend.estimate.setup import Setup


def dense_mlp_saved(saved: Saved, arch: Arch, dims: Dims, setup: Setup, lins: dict[str, Linear], in_key: str, in_e: int,
                    in_grad: bool, inter: int, prefix: str = "", rows: int | None = None) -> int:
    """Gated MLP: the activation saves the gate output, the product saves the activation and the up
    output, down_proj (if trained) the product: 4 x intermediate per token. GELU MLP: fc1 output
    (four tensors of it for GPT-2's gelu_new), and fc2's input (if trained). GPT-2 and Phi-3 add a
    residual dropout mask. Returns the output's bytes per element."""
    T = setup.tokens if rows is None else rows
    p = prefix
    if arch.gated_mlp:
        if arch.fused_gate_up:
            g_e = u_e = linear(saved, setup, lins[p + "gate_up"], in_key, in_e, in_grad, rows)
            saved.put(p + "gate_up_out", T * 2 * inter * g_e)
            gate_key = p + "gate_up_out"
        else:
            g_e = linear(saved, setup, lins[p + "gate"], in_key, in_e, in_grad, rows)
            u_e = linear(saved, setup, lins[p + "up"], in_key, in_e, in_grad, rows)
            saved.put(p + "up_out", T * inter * u_e)
            gate_key = p + "gate_out"
        activation(saved, dims.act, setup, p + "act", gate_key, g_e, T * inter * (2 if arch.fused_gate_up else 1))
        saved.put(p + "act_out", T * inter * g_e)
        out_e = linear(saved, setup, lins[p + "down"], p + "prod", max(g_e, u_e), True, rows)
    else:
        g_e = linear(saved, setup, lins["fc1"], in_key, in_e, in_grad, rows)
        activation(saved, dims.act, setup, "act", "fc1_out", g_e, T * inter)
        out_e = linear(saved, setup, lins["fc2"], "act_out", g_e, True, rows)
    if not prefix:
        dropout(saved, setup, "mlp_resid_dropout", dims.resid_dropout, T * dims.hidden, out_e, True)
    return out_e


def moe_saved(saved: Saved, arch: Arch, dims: Dims, setup: Setup, lins: dict[str, Linear], in_key: str, in_e: int,
              in_grad: bool) -> int:
    """The sparse MoE block, as transformers 5.24 runs it (`grouped_mm`, its default experts
    implementation): the router's linear, its fp32 softmax, top-k indices (and the normalisation's
    division); the experts see every token once per chosen expert (S = tokens x top_k rows): the
    gathered input (if the experts are trained), gate_up's output and the activation, the product
    (if trained), the down output and the routing weights for their product, and three int64 index
    vectors. A grouped matmul saves its input only when the expert weights need a gradient.

    LoRA on the fused experts (peft's ParamWrapper, which `all-linear` targets for qwen3_moe and
    mixtral) folds W + s*B@A into a fresh expert stack per forward pass, which the grouped matmul
    saves: every layer then holds a full copy of its experts' weights for the backward pass.
    Returns the output's bytes per element (the input's)."""
    T, c, E, k, H, I = setup.tokens, setup.compute_bytes, dims.experts, dims.top_k, dims.hidden, dims.expert_intermediate
    S = T * k
    we = setup.weight_bytes  # the router stays in the load dtype (never quantized; fp32 once k-bit prepared)
    xe = c if setup.quant else we  # the fused experts too, but the worker keeps them off peft's fp32 upcast
    experts_lora = "experts_gate_up" in setup.targets or "experts_down" in setup.targets
    router_lora = "router" in setup.targets
    router_trained = setup.full or router_lora
    experts_trained = setup.full or experts_lora
    if dims.router_jitter and in_grad:
        saved.put("router_jitter_noise", T * H * in_e)

    # router: F.linear(x, W) (+ peft's W + delta), softmax in fp32, top-k
    if router_trained:
        if setup.autocast and in_e != c:
            saved.put("router.in_c", T * H * c)
        else:
            saved.put(in_key, T * H * in_e)
    if router_lora and in_grad:
        saved.put("router.merged_weight", E * H * (c if setup.autocast else we))
    elif setup.autocast and we != c and in_grad:
        saved.put("router.weight_c", E * H * c)
    logit_e = c if setup.autocast else we
    weights_grad = in_grad or router_trained
    if weights_grad:
        saved.put("router.probs32", T * E * 4)
        if dims.norm_topk:
            saved.put("router.topk_values", T * k * 4)
            saved.put("router.topk_sum", T * 4)
        if dims.router_aux_loss:
            saved.put("router.aux_softmax", T * E * logit_e)
    saved.put("router.topk_indices", T * k * 8)
    sw_e = 4 if arch.router_weights_fp32 else logit_e

    # experts (grouped_mm): inputs cast to the experts' dtype (grouped_mm is outside autocast)
    saved.put("experts.gather_index", S * 8)
    saved.put("experts.weight_index", S * 8)
    saved.put("experts.unperm_index", S * 8)
    saved.put("experts.offsets", 2 * E * 4)
    x_grad = in_grad
    if experts_trained:
        saved.put("experts.in", S * H * xe)
    gu = E * (2 if arch.gated_mlp else 1) * I * H
    if experts_lora:
        if x_grad:
            saved.put("experts.merged_gate_up", gu * xe)
        if setup.adapter_bytes != xe:
            saved.put("experts.lora_factors_c", setup.rank * E * (3 * H + 3 * I) * xe)
    h_grad = x_grad or experts_trained
    if h_grad:
        saved.put("experts.gate_up_out", S * 2 * I * xe)
        saved.put("experts.act_out", S * I * xe)
    if experts_trained:
        saved.put("experts.prod", S * I * xe)
    if experts_lora and h_grad:
        saved.put("experts.merged_down", E * H * I * xe)
    if weights_grad:
        saved.put("experts.down_out", S * H * xe)
    if h_grad:
        saved.put("experts.routing_weights", S * sw_e)
    out_e = in_e

    if arch.shared_expert:
        sh_e = dense_mlp_saved(saved, arch, dims, setup, lins, in_key, in_e, in_grad, dims.shared_intermediate, prefix="shared_")
        g_e = linear(saved, setup, lins["shared_expert_gate"], in_key, in_e, in_grad)
        saved.put("shared_gate_sigmoid", T * g_e)
        saved.put("shared_out", T * H * sh_e)
    return out_e
