"""Tensor accounting for bench/estimate_measure.py: storages counted once, the tensors autograd saves,
and the peak of a whole training step on the CPU (which has no counter like torch.cuda.max_memory_allocated)."""

from __future__ import annotations

import weakref


def _storage_key(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


def _tensors_in(obj) -> list:
    import torch

    out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            out.extend(_tensors_in(item))
    elif isinstance(obj, dict):
        for item in obj.values():
            out.extend(_tensors_in(item))
    return out


class _SavedTensorMeter:
    """Records every tensor autograd saves (weakly) so that the live ones can be counted later."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []
        self.hooks = None

    def __enter__(self):
        import torch

        def pack(t):
            try:
                self.refs.append(weakref.ref(t))
            except TypeError:  # pragma: no cover - every torch.Tensor supports weak references
                pass
            return t

        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    def live(self) -> list:
        return [t for t in (r() for r in self.refs) if t is not None]


def _unique_bytes(tensors, exclude: set) -> tuple[int, set]:
    seen: set = set()
    total = 0
    for t in tensors:
        if t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key in exclude or key in seen or key[1] == 0:
            continue
        seen.add(key)
        total += key[1]
    return total, seen


class PeakTracker:
    """The most bytes of tensor storage alive at once, on the CPU (which has no allocator counter
    like torch.cuda.max_memory_allocated): a dispatch mode that counts every new storage an
    operation returns until it is freed. Storages that existed before (`known`) are left out."""

    def __init__(self, known: set[int]) -> None:
        self.known, self.live, self.now, self.peak = known, {}, 0, 0

    def _track(self, t) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.known or key in self.live or size == 0:
            return
        self.live[key] = size
        self.now += size
        self.peak = max(self.peak, self.now)

        def freed(key=key, size=size):
            if self.live.pop(key, None) is not None:
                self.now -= size

        weakref.finalize(storage, freed)

    def mode(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        tracker._track(t)
                return out

        return Mode()


def cpu_step_peak(model, optimizer, inputs: dict, amp, static: list) -> int:
    """A second, steady-state step (optimizer state exists, gradients set to None as the Trainer
    does) under PeakTracker: the bytes that existed before (weights, adapters, optimizer state)
    plus the most new storage alive at once during the forward, backward and optimizer step."""
    import gc

    import torch

    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    held = list(static) + [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    held += [t for t in inputs.values() if isinstance(t, torch.Tensor)]
    known, before = set(), 0
    for t in held:
        storage = t.untyped_storage()
        if storage.data_ptr() not in known:
            known.add(storage.data_ptr())
            before += storage.nbytes()
    tracker = PeakTracker(known)
    with tracker.mode():
        with amp():
            loss = model(**inputs, use_cache=False).loss
        loss.backward()
        del loss
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return before + tracker.peak

