"""Model families' structure (Arch), the numbers read from config.json (Dims), linears and parameter counts."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal


@dataclass(frozen=True)
class Arch:
    """What the estimator needs to know about a model family beyond config.json's numbers: how its
    Hugging Face implementation (transformers 5.24) is built, where that changes what is saved."""

    family: str
    norm: Literal["rms", "rms_gemma", "layer"]
    """rms: Llama's RMSNorm (w * x.to(dtype)); rms_gemma: Gemma's, (1 + w) * x in fp32, cast back
    last; layer: LayerNorm with weight and bias."""
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
    sandwich_norms: bool = False
    """Gemma 2/3: four norms per layer (input, post_attention on the attention output, pre_ and
    post_feedforward around the MLP)."""
    qk_norm: Literal["", "bshd", "bhsd"] = ""
    """RMSNorm over head_dim on q and k: before the transpose (Qwen3) or after it (Gemma 3)."""
    embed_scale: bool = False
    """Gemma: embeddings times sqrt(hidden_size)."""
    learned_positions: bool = False
    """GPT-2: a position embedding table (n_positions x hidden) instead of rotary embeddings."""
    sdpa: bool = True
    """False where transformers refuses SDPA (Gemma 2: `_supports_sdpa = False`); it runs eager."""
    eager_softmax_fp32: bool = True
    """Eager attention's softmax runs in fp32 and is cast back (Llama); GPT-2's runs in the input dtype."""
    moe: Literal["", "qwen2_moe", "qwen3_moe", "mixtral"] = ""
    shared_expert: bool = False
    """Qwen2-MoE: a dense MLP beside the routed experts, scaled by sigmoid(shared_expert_gate(x))."""
    router_weights_fp32: bool = False
    """Mixtral: the routing weights stay fp32 (no cast back), so the weighted expert outputs are fp32."""
    lora_expert_params: bool = False
    """peft 0.21 turns `all-linear` into target_parameters on the fused experts and the router for
    these model types (its v4 -> v5 conversion table covers mixtral and qwen3_moe, not qwen2_moe)."""
    expert_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """LoRA target names that peft maps onto the fused experts / router (v4 module names)."""
    attn_output_gate: bool = False
    """Qwen3.5: q_proj is twice as wide (query and a gate per head) and the attention output is
    multiplied by sigmoid(gate) before o_proj."""


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
    measured=True,
)
QWEN2 = replace(LLAMA, family="qwen2", qkv_bias=True)
QWEN3 = replace(LLAMA, family="qwen3", qk_norm="bshd")
GEMMA2 = replace(LLAMA, family="gemma2", norm="rms_gemma", sandwich_norms=True, embed_scale=True, sdpa=False)
GEMMA3 = replace(LLAMA, family="gemma3_text", norm="rms_gemma", sandwich_norms=True, embed_scale=True, qk_norm="bhsd")
GPT2 = Arch(
    family="gpt2",
    norm="layer",
    gated_mlp=False,
    fused_qkv=True,
    fused_gate_up=False,
    parallel_residual=False,
    qkv_bias=True,
    o_bias=True,
    mlp_bias=True,
    names={"qkv": "c_attn", "o": "c_proj", "fc1": "c_fc", "fc2": "c_proj"},
    query_layout_bshd=False,
    measured=True,
    learned_positions=True,
    eager_softmax_fp32=False,
)
QWEN2_MOE = replace(QWEN2, family="qwen2_moe", moe="qwen2_moe", shared_expert=True)
QWEN3_MOE = replace(QWEN3, family="qwen3_moe", moe="qwen3_moe", lora_expert_params=True,
                    expert_names={"router": ("gate",), "experts_gate_up": ("gate_proj", "up_proj"),
                                  "experts_down": ("down_proj",)})
QWEN3_5 = replace(QWEN3, family="qwen3_5_text", norm="rms_gemma", attn_output_gate=True)
"""Qwen3.5's decoder: Qwen3's attention (gated, Gemma-style (1 + w) norms) on every
full_attention_interval-th layer, Gated DeltaNet linear attention on the others (linear_attention.py)."""
MIXTRAL = replace(LLAMA, family="mixtral", moe="mixtral", router_weights_fp32=True, lora_expert_params=True,
                  expert_names={"router": ("gate",), "experts_gate_up": ("w1", "w3"), "experts_down": ("w2",)})


@dataclass(frozen=True)
class Dims:
    """The numbers read from config.json (in the family's own key names, see families.py)."""

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
    positions: int = 0
    """Learned position embeddings (GPT-2's n_positions); 0 with rotary embeddings."""
    attn_softcap: float | None = None
    final_softcap: float | None = None
    layer_types: tuple[str, ...] = ()
    """Per layer "full_attention" or "sliding_attention"; empty: all full."""
    sliding_window: int | None = None
    """The window of the sliding-attention layers (None: no windowed layers)."""
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    embd_dropout: float = 0.0
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    sparse_layers: tuple[bool, ...] = ()
    """Per layer: True where the MLP is the mixture of experts (decoder_sparse_step, mlp_only_layers)."""
    norm_topk: bool = False
    router_aux_loss: bool = False
    """output_router_logits: the load-balancing loss runs in training too."""
    router_jitter: bool = False
    """Mixtral's router_jitter_noise > 0: the hidden states are multiplied by saved noise."""
    extra_params: int = 0
    """Parameters outside the text decoder that transformers builds too (a multimodal model's vision
    tower and projector), held as frozen weights; no text-only step runs them."""
    extra_linear_params: int = 0
    """Of those, the weights of nn.Linear modules (peft's all-linear adapts them as well)."""
    extra_linears: tuple[tuple[int, int, int], ...] = ()
    """(in, out, count) of those linears, for their adapters."""
    linear_k_heads: int = 0
    """Qwen3.5's Gated DeltaNet layers (layer_types "linear_attention"): key heads (0: none)."""
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    conv_kernel: int = 0
    """The depthwise causal convolution's width over q, k and v (linear_conv_kernel_dim)."""

    @property
    def linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def conv_dim(self) -> int:
        """Channels of the linear-attention convolution: q and k (key width each) and v."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def moe_layers(self) -> int:
        return sum(self.sparse_layers)


@dataclass(frozen=True)
class Linear:
    role: str
    name: str
    inp: int
    out: int
    bias: bool


@dataclass(frozen=True)
class LayerKind:
    """Decoder layers that are built alike: `count` of them, with these linears."""

    moe: bool
    count: int
    linears: tuple[Linear, ...]
    mixer: str = "attention"
    """"attention", or "linear_attention" for Qwen3.5's Gated DeltaNet layers."""


def _attention_linears(arch: Arch, dims: Dims) -> list[Linear]:
    n = arch.names
    if arch.attn_output_gate:
        return [Linear("q", n["q"], dims.hidden, 2 * dims.q_dim, dims.qkv_bias), Linear("k", n["k"], dims.hidden, dims.kv_dim, dims.qkv_bias),
                Linear("v", n["v"], dims.hidden, dims.kv_dim, dims.qkv_bias), Linear("o", n["o"], dims.q_dim, dims.hidden, dims.o_bias)]
    if arch.fused_qkv:
        out = [Linear("qkv", n["qkv"], dims.hidden, dims.q_dim + 2 * dims.kv_dim, dims.qkv_bias)]
    else:
        out = [Linear("q", n["q"], dims.hidden, dims.q_dim, dims.qkv_bias), Linear("k", n["k"], dims.hidden, dims.kv_dim, dims.qkv_bias),
               Linear("v", n["v"], dims.hidden, dims.kv_dim, dims.qkv_bias)]
    return out + [Linear("o", n["o"], dims.q_dim, dims.hidden, dims.o_bias)]


def _mlp_linears(arch: Arch, dims: Dims, inter: int, prefix: str = "") -> list[Linear]:
    n = arch.names
    if not arch.gated_mlp:
        return [Linear("fc1", n["fc1"], dims.hidden, inter, dims.mlp_bias), Linear("fc2", n["fc2"], inter, dims.hidden, dims.mlp_bias)]
    if arch.fused_gate_up:
        first = [Linear(prefix + "gate_up", n["gate_up"], dims.hidden, 2 * inter, dims.mlp_bias)]
    else:
        first = [Linear(prefix + "gate", n["gate"], dims.hidden, inter, dims.mlp_bias),
                 Linear(prefix + "up", n["up"], dims.hidden, inter, dims.mlp_bias)]
    return first + [Linear(prefix + "down", n["down"], inter, dims.hidden, dims.mlp_bias)]


def _linear_attention_linears(dims: Dims) -> list[Linear]:
    """Qwen3.5's Gated DeltaNet projections (transformers 5.25 names): q, k and v together (into the
    convolution), the output gate z, beta's b and the decay's a (one per value head), and out_proj."""
    kd, vd, nv = dims.linear_k_heads * dims.linear_k_dim, dims.linear_v_heads * dims.linear_v_dim, dims.linear_v_heads
    return [Linear("lin_qkv", "in_proj_qkv", dims.hidden, 2 * kd + vd, False), Linear("lin_z", "in_proj_z", dims.hidden, vd, False),
            Linear("lin_b", "in_proj_b", dims.hidden, nv, False), Linear("lin_a", "in_proj_a", dims.hidden, nv, False),
            Linear("lin_out", "out_proj", vd, dims.hidden, False)]


def layer_kinds(arch: Arch, dims: Dims) -> list[LayerKind]:
    """The decoder's layer kinds: dense layers, and the mixture-of-experts ones (whose nn.Linear
    modules are attention and, in Qwen2-MoE, the shared expert and its one-output gate); Qwen3.5's
    linear-attention layers are a kind of their own (dense, listed after its attention layers)."""
    attention = _attention_linears(arch, dims)
    kinds = []
    dense = dims.layers - dims.moe_layers - dims.linear_layers
    if dims.linear_layers:
        mlp = _mlp_linears(arch, dims, dims.intermediate)
        out = [LayerKind(False, dense, tuple(attention + mlp))] if dense else []
        return out + [LayerKind(False, dims.linear_layers, tuple(_linear_attention_linears(dims) + mlp), "linear_attention")]
    if dense:
        kinds.append(LayerKind(False, dense, tuple(attention + _mlp_linears(arch, dims, dims.intermediate))))
    if dims.moe_layers:
        lins = list(attention)
        if arch.shared_expert:
            lins += _mlp_linears(arch, dims, dims.shared_intermediate, prefix="shared_")
            lins.append(Linear("shared_expert_gate", "shared_expert_gate", dims.hidden, 1, False))
        kinds.append(LayerKind(True, dims.moe_layers, tuple(lins)))
    return kinds


def layer_linears(arch: Arch, dims: Dims) -> list[Linear]:
    """The linear layers of one decoder layer (in forward order): the first kind's (dense if any)."""
    return list(layer_kinds(arch, dims)[0].linears)


def all_linears(arch: Arch, dims: Dims) -> list[tuple[Linear, int]]:
    """Every decoder nn.Linear (bitsandbytes quantizes these), with how many layers hold it."""
    return [(lin, kind.count) for kind in layer_kinds(arch, dims) for lin in kind.linears]


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by kind, for the whole model."""

    linear_weights: int
    """Decoder linears' weight matrices (what bitsandbytes quantizes)."""
    linear_biases: int
    norms: int
    """With Qwen3.5's linear-attention layers' conv1d, dt_bias and A_log (layer_tensor_sizes)."""
    embedding: int
    lm_head: int
    """Zero when tied to the embedding."""
    linear_tensors: int
    other_tensors: int
    largest_linear: int
    experts: int = 0
    """Fused expert weights (3-D nn.Parameters, not nn.Linear: never quantized)."""
    router: int = 0
    positions: int = 0
    extra: int = 0
    """Outside the text decoder (a multimodal model's vision tower), frozen and never run."""

    @property
    def total(self) -> int:
        return (self.linear_weights + self.linear_biases + self.norms + self.embedding + self.lm_head
                + self.experts + self.router + self.positions + self.extra)

    @property
    def text(self) -> int:
        """What a text-only step uses (and so trains): all but `extra`."""
        return self.total - self.extra

    @property
    def tensors(self) -> int:
        return self.linear_tensors + self.other_tensors


def norm_sizes(arch: Arch, dims: Dims) -> list[int]:
    """Element counts of one decoder layer's norm tensors (weights, and biases for LayerNorm)."""
    per = [dims.hidden] * (2 if arch.norm == "layer" else 1)
    sizes = per * (4 if arch.sandwich_norms else 2)
    if arch.qk_norm:
        sizes += [dims.head_dim, dims.head_dim]
    return sizes


def layer_tensor_sizes(arch: Arch, dims: Dims) -> list[int]:
    """Element counts of every decoder layer's tensors that are not nn.Linear or experts: the norms
    and, in Qwen3.5's linear-attention layers, the depthwise conv1d's weight (no bias), dt_bias, A_log
    and the gated RMSNorm over a value head."""
    if not dims.linear_layers:
        return norm_sizes(arch, dims) * dims.layers
    shared = [dims.hidden, dims.hidden]
    full = (shared + [dims.head_dim, dims.head_dim]) * (dims.layers - dims.linear_layers)
    nv = dims.linear_v_heads
    linear = (shared + [dims.conv_dim * dims.conv_kernel, nv, nv, dims.linear_v_dim]) * dims.linear_layers
    return full + linear


def expert_sizes(arch: Arch, dims: Dims) -> list[int]:
    """Element counts of one MoE layer's non-Linear tensors: fused experts and the router."""
    gate_up = dims.experts * (2 if arch.gated_mlp else 1) * dims.expert_intermediate * dims.hidden
    down = dims.experts * dims.hidden * dims.expert_intermediate
    return [gate_up, down, dims.experts * dims.hidden]


def count_params(arch: Arch, dims: Dims) -> ParamCounts:
    """Parameters derived from the architecture (equal to what transformers builds: tested against
    meta-device models of real config.json files)."""
    lw = lb = lin_tensors = 0
    for lin, count in all_linears(arch, dims):
        lw += lin.inp * lin.out * count
        lb += (lin.out if lin.bias else 0) * count
        lin_tensors += (2 if lin.bias else 1) * count
    layer_tensors = layer_tensor_sizes(arch, dims)
    final = [dims.hidden] * (2 if arch.norm == "layer" else 1)
    norms = sum(layer_tensors) + sum(final)
    experts = router = 0
    if dims.moe_layers:
        gate_up, down, rt = expert_sizes(arch, dims)
        experts, router = (gate_up + down) * dims.moe_layers, rt * dims.moe_layers
    other = (len(layer_tensors) + len(final) + 1 + (0 if dims.tied else 1) + (1 if dims.positions else 0)
             + 3 * dims.moe_layers)
    return ParamCounts(
        linear_weights=lw,
        linear_biases=lb,
        norms=norms,
        embedding=dims.vocab * dims.hidden,
        lm_head=0 if dims.tied else dims.vocab * dims.hidden,
        linear_tensors=lin_tensors,
        other_tensors=other,
        largest_linear=max(lin.inp * lin.out for lin, _ in all_linears(arch, dims)),
        experts=experts,
        router=router,
        positions=dims.positions * dims.hidden,
        extra=dims.extra_params,
    )
