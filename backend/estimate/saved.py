"""What single operations save for backward: the ledger (Saved) and the rules for linears, norms,
activation functions and dropout, as torch autograd and the Hugging Face / peft modules do them."""

from __future__ import annotations

from backend.estimate.architectures import Linear
from backend.estimate.setup import Setup


class Saved:
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


def linear(saved: Saved, setup: Setup, lin: Linear, inp_key: str, inp_e: int, inp_grad: bool, rows: int | None = None) -> int:
    """What one linear (nn.Linear, GPT-2's Conv1D: the same addmm) saves; returns its output's bytes
    per element. `rows`: the tokens it sees (all of them unless given).

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
    T, c = (setup.tokens if rows is None else rows), setup.compute_bytes
    quantized = setup.quant is not None and lin.role != "lm_head"
    if setup.full:
        if setup.autocast and inp_e != c:
            saved.put(f"{lin.role}.in_c", T * lin.inp * c)
        else:
            saved.put(inp_key, T * lin.inp * inp_e)
        if setup.autocast and setup.weight_bytes != c and inp_grad:
            saved.put(f"{lin.role}.weight_c", lin.inp * lin.out * c)
        out_e = c if setup.autocast else setup.weight_bytes
    elif quantized:
        out_e = inp_e
        if setup.quant == "int8" and setup.device == "cpu":
            saved.put(inp_key, T * lin.inp * inp_e)
            saved.ctx_held.add(inp_key)
            out_e = c if setup.autocast else inp_e  # MatMul8bitFp dequantizes and calls F.linear
    else:
        if setup.autocast and setup.weight_bytes != c and inp_grad:
            saved.put(f"{lin.role}.weight_c", lin.inp * lin.out * c)
        out_e = c if setup.autocast else setup.weight_bytes
    if lin.role in setup.targets:
        ae = setup.adapter_bytes
        mask_e = 1 if setup.device == "cuda" else ae
        if setup.autocast:
            if setup.dropout and inp_grad:
                saved.put(f"{lin.role}.dropout_mask", T * lin.inp * mask_e)
            saved.put(f"{lin.role}.in_c", T * lin.inp * c)
            saved.put(f"{lin.role}.lora_mid", T * setup.rank * c)
            if inp_grad:
                saved.put(f"{lin.role}.lora_A_c", setup.rank * lin.inp * c)
            saved.put(f"{lin.role}.lora_B_c", lin.out * setup.rank * c)
            adapter_out_e = c
        else:
            if setup.dropout:
                # the dropped copy feeds lora_A (the mask only when the input needs a gradient)
                saved.put(f"{lin.role}.dropout_in", T * lin.inp * ae)
                if inp_grad:
                    saved.put(f"{lin.role}.dropout_mask", T * lin.inp * mask_e)
            elif ae == inp_e:
                saved.put(inp_key, T * lin.inp * inp_e)
            else:
                saved.put(f"{lin.role}.in_{ae}", T * lin.inp * ae)
            saved.put(f"{lin.role}.lora_mid", T * setup.rank * ae)
            adapter_out_e = ae
        if setup.method == "dora":
            saved.put(f"{lin.role}.dora_base", T * lin.out * out_e)
            saved.put(f"{lin.role}.dora_lora", T * lin.out * adapter_out_e)
            saved.put(f"{lin.role}.dora_vectors", 3 * lin.out * 4)
    return out_e


def norm(saved: Saved, kind: str, setup: Setup, name: str, x_key: str, x_e: int, x_grad: bool, width: int,
         rows: int | None = None) -> int:
    """What a norm saves; returns its output's bytes per element. `rows` vectors of `width` each
    (the tokens, or tokens x heads for q/k norms).

    RMSNorm (Llama): upcasts x to fp32 and saves it (x itself when already fp32), saves rsqrt (one
    fp32 per row) and, when its weight is trained, the normalized x in x's dtype; the output takes
    the wider of the weight's and x's dtypes. Gemma's RMSNorm: the same fp32 x and rsqrt, then
    (1 + w.float()) (a fresh width-sized fp32 vector, saved when x needs a gradient) times the fp32
    normalized x (saved when w is trained), cast back to x's dtype. LayerNorm (native_layer_norm):
    saves x and a mean and rstd per row (fp32 on CUDA, x's dtype on CPU); under CUDA autocast it
    runs in fp32 (x is upcast, a saved copy, and the output is fp32)."""
    T = setup.tokens if rows is None else rows
    if kind in ("rms", "rms_gemma"):
        if x_grad:
            saved.put(x_key if x_e == 4 else f"{name}.x32", T * width * 4)
            saved.put(f"{name}.rstd", T * 4)
        if kind == "rms_gemma":
            if x_grad:
                saved.put(f"{name}.one_plus_w", width * 4)
            if setup.full:
                saved.put(f"{name}.normed32", T * width * 4)
            return x_e
        if setup.full:
            saved.put(f"{name}.normed", T * width * x_e)
        return max(setup.weight_bytes, x_e)
    if not (x_grad or setup.full):
        return max(setup.weight_bytes, x_e) if not (setup.autocast and setup.device == "cuda") else 4
    if setup.autocast and setup.device == "cuda":
        saved.put(x_key if x_e == 4 else f"{name}.x32", T * width * 4)
        saved.put(f"{name}.stats", 2 * T * 4)
        return 4
    saved.put(x_key, T * width * x_e)
    saved.put(f"{name}.stats", 2 * T * (4 if setup.device == "cuda" else x_e))
    return max(setup.weight_bytes, x_e)


def activation(saved: Saved, act: str, setup: Setup, name: str, x_key: str, x_e: int, numel: int) -> int:
    """What the MLP's activation function saves of its input (`numel` elements); returns the output's
    bytes per element. SiLU, GELU (erf or tanh, native kernels), ReLU: the input. GPT-2's gelu_new
    is Python, 0.5*x*(1 + tanh(c*(x + 0.044715*x^3))): pow saves x, tanh its output, and the last
    product both of its factors (0.5*x and 1 + tanh): four tensors the size of x."""
    saved.put(x_key, numel * x_e)
    if act == "gelu_new":
        saved.put(f"{name}.tanh", numel * x_e)
        saved.put(f"{name}.half_x", numel * x_e)
        saved.put(f"{name}.one_plus_tanh", numel * x_e)
    return x_e


def dropout(saved: Saved, setup: Setup, name: str, p: float, numel: int, x_e: int, x_grad: bool) -> None:
    """Dropout in training (p > 0, input needing a gradient) saves its mask: bool on CUDA (the fused
    native_dropout), and on the CPU the scaled noise it multiplies by, in the input's dtype."""
    if p > 0 and x_grad:
        saved.put(f"{name}.mask", numel * (1 if setup.device == "cuda" else x_e))
