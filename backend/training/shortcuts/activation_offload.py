"""Checkpointed activations in host memory: each layer's saved input waits for backward on the CPU.

With gradient checkpointing (non-reentrant, every layer) what a step holds on the GPU for backward
is mostly each decoder layer's input hidden states, batch x seq x hidden per layer: at long rows
that is what fills the card. Here each layer's forward runs under saved-tensor hooks that copy that
one input to pinned host memory as the checkpoint saves it, and copy it back when the backward pass
recomputes the layer. The checkpoint's own hooks take everything saved inside the layer, and the
keyword inputs (masks, rotary tables, shared by every layer) stay where they are, so exactly one
tensor per layer moves each way; the values are copies, so loss and gradients are unchanged.

It costs a device-to-host and a host-to-device copy of each layer's input per step, so it runs only
where a setting asks for it (technique.activation_offload): the registry (shortcuts.py) applies it
on CUDA with checkpointing on. Nothing in transformers is patched: the layers' own forward is
wrapped per instance, as last_layer_rows.py does.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


class ActivationOffload:
    """Wraps every checkpointed decoder layer of one model; counts the inputs it moved (tests read it)."""

    def __init__(self, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory  # pinned host pages: asynchronous copies each way (CUDA only)
        self.offloaded = 0  # layer inputs moved to host memory so far
        self.kept = 0  # other tensors the hooks saw (none: the checkpoint's own hooks take the layer's)
        self.layers = 0

    def install(self, model: Any) -> int:
        """Wrap the forward of every GradientCheckpointingLayer; returns how many."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        for module in model.modules():
            if isinstance(module, GradientCheckpointingLayer) and not hasattr(module, "_activation_offload"):
                module._activation_offload = self
                module.forward = types.MethodType(self._offloaded(module.forward), module)
                self.layers += 1
        return self.layers

    def _offloaded(self, forward: Callable[..., Any]) -> Callable[..., Any]:
        offload = self

        def forward_offloaded(module: torch.nn.Module, hidden: Any, *args: Any, **kwargs: Any) -> Any:
            if not (getattr(module, "gradient_checkpointing", False) and module.training and torch.is_grad_enabled()
                    and isinstance(hidden, torch.Tensor)):
                return forward(hidden, *args, **kwargs)
            with torch.autograd.graph.saved_tensors_hooks(offload._pack(hidden), offload._unpack):
                return forward(hidden, *args, **kwargs)

        return forward_offloaded

    def _pack(self, hidden: torch.Tensor) -> Callable[[torch.Tensor], Any]:
        # The input is known by address and shape: a reference to it here would outlive the forward
        # (autograd keeps the hooks with the saved tensor) and hold the device copy.
        address, shape = hidden.data_ptr(), hidden.shape

        def pack(tensor: torch.Tensor) -> Any:
            if tensor.data_ptr() != address or tensor.shape != shape:
                self.kept += 1
                return tensor  # not the layer's input: stays where it is
            host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=self.pin_memory)
            host.copy_(tensor, non_blocking=self.pin_memory)  # one stream: ordered before any reuse of the block
            self.offloaded += 1
            return (tensor.device, host)

        return pack

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)
