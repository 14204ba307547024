"""LoRA's small matrix products with the rank as the rows, where the CPU BLAS is slow the other way.

peft computes `x @ A.T` and `@ B.T` as two `nn.Linear`s, whose forward and backward ask for products
with only `rank` output columns, a shape MKL's sgemm handles badly. `LoraMatmul` computes the same
values in the fast orientation (h.T = A @ x.T, then `result + scaling * h @ B.T` as one `addmm`, and
a backward that keeps the rank as the rows), with the same parameters and saved tensors, so
adapters save, merge and export as before and the memory estimate is unchanged; the loss and
gradients match peft's to float rounding (tests hold 1e-5).

Installed where the registry chose it (backend/core/registries/shortcuts.py: CPU, fp32, LoRA, hidden up to
`RANK_FIRST_MAX_HIDDEN`), and used per call only in the plain case: peft's dense `lora.Linear` over
an `nn.Linear`, one active adapter, not merged, no DoRA or LoRA bias, on the CPU in fp32 with
autocast off. Everything else runs peft's forward unchanged.

`bf16_base=True` (the plan's choice on a CPU with native bf16, precision auto) also holds the frozen
base weights of these layers in bf16 and runs their products in bf16 (fp32 accumulation), in forward
and for the input gradient: bf16 mixed precision confined to the frozen products, while adapters,
activations, norms, attention, the loss and Adam stay fp32. Not torch.autocast, which casts every
frozen weight again on every call. The measurements behind both: docs/benchmarks.md, "Rank-first
LoRA and the bf16 base".
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


class LoraMatmul:
    """Installs the rank-as-rows forward on a peft model's LoRA linears; counts what it patched."""

    def __init__(self, bf16_base: bool = False, rank_first: bool = True) -> None:
        self.patched = 0
        self.bf16_base = bf16_base
        self.rank_first = rank_first  # off: the adapters multiply as peft does (only the base runs in bf16)
        self.active = True  # False: peft's forward for the fp32 layers (the benchmark switches it per step)

    def install(self, model: torch.nn.Module) -> int:
        try:
            from peft.tuners.lora.layer import Linear as LoraLinear
        except ImportError:
            return 0
        for module in model.modules():
            if type(module) is LoraLinear and type(module.base_layer) is torch.nn.Linear:
                weight = module.base_layer.weight
                if self.bf16_base and weight.dtype == torch.float32 and not weight.requires_grad:
                    weight.data = weight.data.to(torch.bfloat16)
                    if module.base_layer.bias is not None:  # so that peft's own forward still runs (in bf16)
                        module.base_layer.bias.data = module.base_layer.bias.data.to(torch.bfloat16)
                    module.base_layer.studio_bf16_base = True
                module.forward = types.MethodType(_fast_forward(module.forward, self), module)
                self.patched += 1
        return self.patched


def _fast_forward(original: Callable[..., torch.Tensor], owner: LoraMatmul) -> Callable[..., torch.Tensor]:
    def forward(module: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapter = _plain_adapter(module, x)
        bf16_base = getattr(module.base_layer, "studio_bf16_base", False)
        rank_first = owner.rank_first and owner.active
        if adapter is None or args or kwargs or not (rank_first or bf16_base):
            if bf16_base and x.dtype != torch.bfloat16:  # e.g. adapters disabled: peft's path, in bf16
                return original(x.to(torch.bfloat16), *args, **kwargs).to(x.dtype)
            return original(x, *args, **kwargs)
        if bf16_base:
            base = Bf16Product.apply(x.reshape(-1, x.shape[-1]), module.base_layer.weight)
            if module.base_layer.bias is not None:
                base = base + module.base_layer.bias.float()
            base = base.view(*x.shape[:-1], base.shape[-1])
        else:
            base = module.base_layer(x)
        x = module.lora_dropout[adapter](x)
        if not rank_first:  # peft's own adapter products, on the bf16 base's output
            return base + module.lora_B[adapter](module.lora_A[adapter](x)) * module.scaling[adapter]
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
    base = module.base_layer
    if base.weight.dtype != torch.float32 and not getattr(base, "studio_bf16_base", False):
        return None
    return adapter


class Bf16Product(torch.autograd.Function):
    """x @ W.T for a frozen bf16 W and fp32 x, computed in bf16 and returned fp32 (see module doc).

    Saves only W (shared with the module, no copy): the input gradient needs W, and W, being frozen,
    needs no gradient of its own, so x is not kept for it.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return (x.to(torch.bfloat16) @ weight.t()).float()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        (weight,) = ctx.saved_tensors
        grad_x = (grad.to(torch.bfloat16) @ weight).float() if ctx.needs_input_grad[0] else None
        return grad_x, None


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
