"""The language-model loss a chunk of rows at a time: no full-vocabulary logits for the whole batch.

The plain step projects every loss position onto the vocabulary, upcasts to fp32, takes a
log-softmax and back-propagates through all of it: at a 128k vocabulary that is gigabytes held
for one scalar. Here the vocabulary projection (lm_head, with Gemma's final soft-capping) and the
cross-entropy run over `rows` positions at a time, and each chunk's gradient (for the hidden
states and any trainable head weight, a tied embedding included) is taken right there, while its
logits exist; backward only scales those gradients by the incoming one. Peak memory holds one
chunk's logits and their gradient, and no work is repeated (the same three products per chunk as
the plain step over all rows).

Hooked without patching transformers: while a training forward with labels runs, the model's
lm_head passes its input through unchanged and the model's `loss_function` (the attribute
transformers reads) computes the chunked loss from those hidden states, with the semantics of
transformers' ForCausalLMLoss: targets shifted by one unless `shift_labels` came (loss_positions.py),
ignore_index -100, a sum over `num_items_in_batch` when given, else the mean over targets. Label
smoothing never reaches a model's loss (the Trainer pops the labels and smooths the logits itself),
so without labels the model runs as it is. Evaluation and generation always run the plain head.
Where it is used is the registry's decision: shortcuts.py.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch

from backend.core.registries import shortcuts  # the chunk size, read at call time (the estimate reads it too)

IGNORE_INDEX = -100


def _chunk_loss(head: Callable[[torch.Tensor], torch.Tensor], part: torch.Tensor, targets: torch.Tensor,
                softcap: float | None) -> torch.Tensor:
    """One chunk's summed cross-entropy; its logits live only in the autograd graph (freed with it)."""
    logits = head(part)
    if softcap is not None:  # Gemma: tanh(logits / cap) * cap, in the logits' dtype as the model does
        logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


class _ChunkedHeadLoss(torch.autograd.Function):
    """sum of cross-entropy(head(hidden[rows]), targets[rows]) over chunks; gradients made in forward."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, targets: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                softcap: float | None, rows: int, *params: torch.Tensor) -> torch.Tensor:
        want_hidden = ctx.needs_input_grad[0]
        want = [i for i, p in enumerate(params) if ctx.needs_input_grad[5 + i]]
        grad_hidden = torch.zeros_like(hidden) if want_hidden else None
        grad_params: list[torch.Tensor | None] = [None] * len(params)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], rows):
            part = hidden[start:start + rows].detach().requires_grad_(want_hidden)
            with torch.enable_grad():
                loss = _chunk_loss(head, part, targets[start:start + rows], softcap)
            wrt = ([part] if want_hidden else []) + [params[i] for i in want]
            if wrt and loss.requires_grad:
                grads = torch.autograd.grad(loss, wrt, allow_unused=True)
                if want_hidden:
                    grad_hidden[start:start + rows] = grads[0]
                    grads = grads[1:]
                for i, g in zip(want, grads):
                    if g is not None:
                        grad_params[i] = g if grad_params[i] is None else grad_params[i] + g
            total += loss.detach()
            del loss
        ctx.grads = (grad_hidden, grad_params)
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_params = ctx.grads
        del ctx.grads
        scale = grad_output
        out_hidden = None if grad_hidden is None else grad_hidden * scale.to(grad_hidden.dtype)
        out_params = tuple(None if g is None else g * scale.to(g.dtype) for g in grad_params)
        return (out_hidden, None, None, None, None, *out_params)


def chunked_causal_loss(hidden: torch.Tensor, labels: torch.Tensor | None, head: Callable[[torch.Tensor], torch.Tensor],
                        params: list[torch.Tensor], *, softcap: float | None = None, rows: int,
                        num_items_in_batch: Any = None, ignore_index: int = IGNORE_INDEX,
                        shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' ForCausalLMLoss over `head(hidden)`, computed `rows` positions at a time."""
    if ignore_index != IGNORE_INDEX:
        raise ValueError(f"chunked loss supports ignore_index {IGNORE_INDEX}, got {ignore_index}")
    if shift_labels is None:
        padded = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = padded[..., 1:]
    targets = shift_labels.reshape(-1).to(hidden.device)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    keep = targets != ignore_index
    count = keep.sum()
    if not bool(keep.all()):  # only the rows that have a target go through the head
        hidden, targets = hidden[keep], targets[keep]
    total = _ChunkedHeadLoss.apply(hidden, targets, head, softcap, rows, *params)
    if num_items_in_batch is None:
        return total / count  # the mean over targets (nan for none, as cross_entropy's mean)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class ChunkedLoss:
    """Installs the chunked loss on one causal LM: its lm_head and loss_function, switched per forward."""

    def __init__(self, elements: int | None = None) -> None:
        self.elements = elements  # None: shortcuts.LOSS_CHUNK_ELEMENTS, read at call time
        self.active = False
        self.calls = 0  # chunked losses computed (what tests and the log read)
        self.head: torch.nn.Module | None = None

    def install(self, model: Any) -> bool:
        """Patch the model's head, loss and forward; False where the model is not a known causal LM shape."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        if not isinstance(head, torch.nn.Module) or not hasattr(base, "loss_function"):
            return False
        if getattr(base, "_chunked_loss", None) is not None:
            return True  # installed already: wrapping the wrappers would make the head an identity for good
        base._chunked_loss = self
        self.head = head
        plain_head, plain_loss, plain_forward = head.forward, base.loss_function, base.forward
        config, chunked = base.config, self

        def head_forward(module: torch.nn.Module, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if chunked.active and not args and not kwargs:
                return hidden  # the loss function projects it, a chunk at a time
            return plain_head(hidden, *args, **kwargs)

        def loss_function(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int | None = None,
                          **kwargs: Any) -> torch.Tensor:
            if not chunked.active:
                return plain_loss(logits, labels, vocab_size, **kwargs)
            chunked.calls += 1
            vocab = int(getattr(config, "vocab_size", 0) or vocab_size or 1)
            params = [p for p in head.parameters() if p.requires_grad]
            return chunked_causal_loss(logits, labels, plain_head, params, softcap=chunked.softcap,
                                       rows=shortcuts.loss_chunk_rows(vocab, chunked.elements),
                                       num_items_in_batch=kwargs.get("num_items_in_batch"),
                                       ignore_index=kwargs.get("ignore_index", IGNORE_INDEX),
                                       shift_labels=kwargs.get("shift_labels"))

        def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if not (module.training and torch.is_grad_enabled() and kwargs.get("labels") is not None):
                return plain_forward(*args, **kwargs)
            cap = getattr(config, "final_logit_softcapping", None)
            chunked.softcap, chunked.active = cap, True
            try:
                if cap is not None:  # applied per chunk; the model must not cap the hidden states
                    config.final_logit_softcapping = None
                return plain_forward(*args, **kwargs)
            finally:
                chunked.active = False
                if cap is not None:
                    config.final_logit_softcapping = cap

        self.softcap: float | None = None
        head.forward = types.MethodType(head_forward, head)
        base.loss_function = loss_function
        base.forward = types.MethodType(forward, base)
        return True
