"""TensorSource: the merged model's tensors, handed out one at a time, for every writer.

An export never needs the whole model in memory: a writer (safetensors shards, GGUF) asks for one
tensor, writes it and drops it. `StateDictSource` serves an in-memory model (small models, tests);
a streaming source reads the base's safetensors lazily and merges each adapted weight on the way.
Writers depend only on this protocol, so the two can change independently.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class TensorSource(Protocol):
    config: Any
    """The merged model's transformers config (model_type, dimensions, rope, ...)."""

    def names(self) -> list[str]:
        """The merged model's state-dict names (transformers' own, as `save_pretrained` writes them)."""
        ...

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, without materializing it."""
        ...

    def get(self, name: str) -> torch.Tensor:
        """The merged tensor on the CPU, in the export's 16-bit dtype (or fp32); the caller drops it."""
        ...


class StateDictSource:
    """A TensorSource over a model already in memory (its state dict, tied weights once)."""

    def __init__(self, model: Any):
        self.config = model.config
        self._state = dict(model.state_dict())

    def names(self) -> list[str]:
        return list(self._state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state[name].shape)

    def get(self, name: str) -> torch.Tensor:
        return self._state[name].detach().cpu()
