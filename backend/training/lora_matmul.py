"""LoRA's small matrix products with the rank as the rows, where the CPU BLAS is slow the other way.

A LoRA adapter multiplies the activations by two thin matrices: `x @ A.T` (tokens x rank) and then
`@ B.T`. peft computes them as two `nn.Linear`s, so the forward pass and the backward pass ask for
products whose *output* has only `rank` columns (`x @ A.T`, `grad @ B`, `grad.T @ h`). On the CPU,
MKL's sgemm handles that shape badly: measured on this project's 1-core bench (AVX-512, MKL 2024.2),
a (295 x 768) @ (768 x 8) product takes 106-268 us, while the same product with the rank as the
rows, (8 x 768) @ (768 x 295), takes 62 us. In the preset's training step, the adapters' products
took 12 ms of 46 ms of matrix work, for under 3% of the FLOPs.

`LoraMatmul` computes the same values in the fast orientation: h.T = A @ x.T (rank x tokens), then
`result + scaling * h @ B.T` as one `addmm`, and a backward that keeps the rank as the rows
(grad_h.T = B.T @ grad.T, grad_B = (h.T @ grad).T, grad_A = grad_h.T @ x). That also drops peft's
separate `* scaling` and `+` over the full (tokens x out) output. Same parameters, same saved
tensors (x and the small h), so adapters save, merge and export exactly as before, and the memory
estimate is unchanged; the loss and gradients match peft's to float rounding (tests hold 1e-5).

Used only where it is the plain case: peft's dense `lora.Linear` over an `nn.Linear`, one active
adapter, not merged, no DoRA or LoRA bias, on the CPU in fp32 with autocast off. Everything else
(GPUs, whose BLAS has no such weakness; bf16; quantized bases; DoRA) runs peft's forward unchanged.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


class LoraMatmul:
    """Installs the rank-as-rows forward on a peft model's LoRA linears; counts what it patched."""

    def __init__(self) -> None:
        self.patched = 0

    def install(self, model: torch.nn.Module) -> int:
        try:
            from peft.tuners.lora.layer import Linear as LoraLinear
        except ImportError:
            return 0
        for module in model.modules():
            if type(module) is LoraLinear and type(module.base_layer) is torch.nn.Linear:
                module.forward = types.MethodType(_fast_forward(module.forward), module)
                self.patched += 1
        return self.patched


def _fast_forward(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapter = _plain_adapter(module, x)
        if adapter is None or args or kwargs:
            return original(x, *args, **kwargs)
        base = module.base_layer(x)
        x = module.lora_dropout[adapter](x)
        out = LoraProduct.apply(base.reshape(-1, base.shape[-1]), x.reshape(-1, x.shape[-1]),
                                module.lora_A[adapter].weight, module.lora_B[adapter].weight,
                                float(module.scaling[adapter]))
        return out.view(base.shape)

    return forward


def _plain_adapter(module: Any, x: torch.Tensor) -> str | None:
    """The one active adapter's name when this call is the plain fp32 CPU case, else None."""
    if module.disable_adapters or module.merged or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    if torch.is_autocast_enabled("cpu"):
        return None
    active = module.active_adapters
    if len(active) != 1 or active[0] not in module.lora_A or active[0] in getattr(module, "lora_variant", {}):
        return None
    adapter = active[0]
    a, b = module.lora_A[adapter], module.lora_B[adapter]
    if a.bias is not None or b.bias is not None or a.weight.dtype != torch.float32 or b.weight.dtype != torch.float32:
        return None
    if module.base_layer.weight.dtype != torch.float32:
        return None
    return adapter


class LoraProduct(torch.autograd.Function):
    """result + scaling * (x @ A.T) @ B.T, with every product shaped rank-first (see module doc)."""

    @staticmethod
    def forward(ctx: Any, result: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                scaling: float) -> torch.Tensor:
        ht = a @ x.t()  # (rank, tokens)
        ctx.save_for_backward(x, a, b, ht)
        ctx.scaling = scaling
        return torch.addmm(result, ht.t(), b.t(), alpha=scaling)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, a, b, ht = ctx.saved_tensors
        s = ctx.scaling
        grad_ht = (b.t() @ grad.t()).mul_(s)  # (rank, tokens)
        grad_x = grad_ht.t() @ a if ctx.needs_input_grad[1] else None
        grad_a = grad_ht @ x if ctx.needs_input_grad[2] else None
        grad_b = (ht @ grad).mul_(s).t().contiguous() if ctx.needs_input_grad[3] else None
        return grad if ctx.needs_input_grad[0] else None, grad_x, grad_a, grad_b, None
