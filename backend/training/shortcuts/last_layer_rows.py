"""The last decoder layer's MLP and attention output only at the rows the loss reads.

After `logits_to_keep` (loss_positions.py) the final hidden state is read only at the positions
whose next token is a target: about one in ten in the demo data. Earlier layers must compute every
position (the next layer's keys and values need them), but in the last layer a position's MLP and
attention output projection feed nothing except its own final state. So for that one layer they run
on the kept rows alone, and the other rows get zeros, which nothing downstream reads: the loss and
every gradient are those of the full computation (tests hold them to 1e-5). On the bundled model
this is the MLP of one layer in four, ~17% of the matrix work of a step.

The rows are set by `SupervisedCountingTrainer` for the span of one training step (so that activation
checkpointing's recomputation, which runs inside backward and on CUDA on another thread, sees them)
and cleared after it; evaluation and generation always run the unmodified layer. Where it is used
(dense decoder layers named as in Llama, Qwen, Mistral, Gemma, Phi-3 and GPT-NeoX; not under
torch.compile, Liger, FSDP or DeepSpeed) is the registry's decision: shortcuts.py.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


class LastLayerRows:
    """Holds the current step's kept-row mask for the patched modules of one model."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None
        self.modules: list[str] = []
        self.patched: list[torch.nn.Module] = []  # what MFU counts at the kept rows only

    def install(self, model: Any) -> bool:
        """Patch the last layer's `mlp` and `self_attn.o_proj` forwards; False where the model is not the known shape."""
        layer = _last_decoder_layer(model)
        if layer is None:
            return False
        found = [("mlp", getattr(layer, "mlp", None)),
                 ("self_attn.o_proj", getattr(getattr(layer, "self_attn", None), "o_proj", None))]
        for name, module in found:
            if module is None or any("expert" in sub for sub, _ in module.named_modules()):
                continue  # a mixture of experts routes over all rows (and its aux loss would change)
            module.forward = types.MethodType(self._rows_only(module.forward), module)
            self.modules.append(name)
            self.patched.append(module)
        return bool(self.modules)

    def _rows_only(self, forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
        rows = self

        def forward_kept_rows(module: torch.nn.Module, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            mask = rows.mask
            if mask is None or args or kwargs or hidden.dim() != 3 or tuple(hidden.shape[:2]) != tuple(mask.shape):
                return forward(hidden, *args, **kwargs)
            kept = forward(hidden[mask])
            out = kept.new_zeros(*hidden.shape[:2], kept.shape[-1])
            out[mask] = kept
            return out

        return forward_kept_rows


def _last_decoder_layer(model: Any) -> torch.nn.Module | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        decoder = base.get_decoder()
    except (AttributeError, NotImplementedError, ValueError):
        return None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        return None
    return layers[-1]
