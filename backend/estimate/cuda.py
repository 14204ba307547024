"""What a CUDA card holds besides the tensors of the step: the CUDA context and the caching
allocator's reserve over the allocated peak, parts of their own so that "fits" means fits.

A card must hold torch.cuda.max_memory_reserved (what the caching allocator has taken from the
driver: the allocated peak plus blocks cached but not in use) plus the CUDA context, which lives
outside the allocator. The estimate's total on CUDA is that sum.
"""

from __future__ import annotations

from backend.estimate.breakdown import MIB

CUDA_CONTEXT_BYTES = 768 * MIB
"""CUDA context and loaded kernels per GPU (driver, cuBLAS/cuDNN handles, torch's kernels), outside
PyTorch's allocator: a round figure for a recent CUDA stack, since older stacks load less and lazy
module loading changes it (the measurement: docs/benchmarks.md, "CUDA context and baseline figures")."""

CUBLAS_WORKSPACE_BYTES = 64 * MIB
"""cuBLAS / cuBLASLt workspaces, allocated once through PyTorch's caching allocator (64 MiB seen
on an H200)."""

ALLOCATOR_RESERVE = 0.35
"""The caching allocator's reserve over the allocated peak, as a share of the memory a step
allocates and frees again (activations, the loss buffers, gradients). Why it scales with those: the
allocator keeps freed blocks cached for reuse, rounds large requests up to 2 MiB pages and splits
cached segments, so the mix of transient sizes a step allocates leaves cached-but-unused memory
beside the peak (fragmentation), while the weights, allocated once, leave none. The share is
calibrated on the only two measurements there are (issue 24: H200, the Llama-3.1-8B QLoRA 16 GB and
Llama-3.2-1B LoRA 12 GB presets; docs/benchmarks.md), not derived."""

RESERVE_NOTE = ("The CUDA caching allocator's reserve over the allocated peak: freed blocks it keeps cached, "
                "rounding and fragmentation; {share:.0%} of the activations, loss buffers and gradients, "
                "calibrated on two H200 runs (docs/benchmarks.md).")
CONTEXT_NOTE = ("The CUDA context (driver, cuBLAS, loaded kernels), outside torch's allocator: {mib} MiB, the "
                "750-835 MiB measured on an H200 (CUDA 13, torch 2.11); older stacks load less.")


def allocator_reserve(transient_bytes: int) -> int:
    """Bytes the allocator reserves beyond the allocated peak, for a step whose memory that is
    allocated and freed every step is `transient_bytes` (see ALLOCATOR_RESERVE)."""
    return int(ALLOCATOR_RESERVE * max(0, transient_bytes))
