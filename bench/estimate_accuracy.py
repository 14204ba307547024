"""How close is `backend.estimate` to the bytes a real training step holds?

Builds tiny random-weight models of every family (bench/estimate_cases.py: the bundled Llama or
`resources/tiny`, a GPT-NeoX, a Qwen2 and a Phi-3 of its own, and tests/families.py's Mistral,
Qwen3, Gemma 2, Gemma 3, GPT-2, Qwen2-MoE, Qwen3-MoE and Mixtral), runs one real training step for
each configuration of a matrix (LoRA / DoRA / QLoRA / LLM.int8 / full, activation checkpointing on
and off, eager / SDPA attention, two sequence lengths, two batch sizes, fp32 / bf16, with and
without the Trainer's autocast) and measures, part by part, what is actually held
(bench/estimate_measure.py, bench/estimate_tensors.py):

- weights, adapters, gradients, optimizer: summed from the tensors themselves after one step of
  the fused `torch.optim.AdamW` the worker uses (LoRA and DoRA through peft);
- activations: every tensor autograd saves during the forward pass, seen through
  `torch.autograd.graph.saved_tensors_hooks`, still alive when the forward pass ends, each storage
  counted once (by `untyped_storage().data_ptr()`), parameters and buffers left out, plus tensors
  that custom autograd Functions keep as ctx attributes (bitsandbytes' int8 matmul). With
  activation checkpointing, the keyword inputs the checkpoint keeps in its closure are added, and
  so is what the largest layer saves when it is recomputed in the backward pass (measured by running
  every layer once more, uncheckpointed, under the same hooks);
- logits: the logits tensor of the output, the log-probabilities the loss saves (any saved storage
  of B*S*vocab elements: Gemma 2's soft-capping saves one more) and the two gradients that exist
  together while the loss' backward runs (read with hooks on the LogSoftmax backward node);
- the whole step's peak: on the CPU a second, steady-state step under a dispatch mode that counts
  every new storage until it is freed, against the estimate's total (its largest phase) and the
  sum of its parts; on a GPU, when there is one, `torch.cuda.max_memory_allocated` over that step
  against the same two, less the CUDA context, the allocator slack and the cuBLAS workspace (which
  that counter does not see). These rows are reported, not part of the ±10% goal.

Prints predicted against measured for every part, the worst relative error per part and the worst
part per family; exits 1 when a part misses ±10%.

    python bench/estimate_accuracy.py                 # the whole matrix (115 configurations, ~7 min)
    python bench/estimate_accuracy.py --quick         # four configurations
    python bench/estimate_accuracy.py --ci            # the test suite's slice (CI_SLICE)
    python bench/estimate_accuracy.py --family gemma2 # one family's configurations
    python bench/estimate_accuracy.py --only amp      # the configurations whose name contains "amp"

The functions here (`measure`, `predict`, `compare`, `MATRIX`, `QUICK`) are imported by
tests/backend/test_estimate.py and tests/backend/test_estimate_families.py, which check CI_SLICE.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import estimate_measure  # noqa: E402
from backend.estimate import PARTS, Breakdown, estimate  # noqa: E402
from estimate_cases import CI_SLICE, MATRIX, QUICK, Case  # noqa: E402,F401
from estimate_measure import build_model, measure  # noqa: E402,F401

TOLERANCE = 0.10
"""The goal: every part within ±10% of what was measured."""

# --- comparing --------------------------------------------------------------------------------


def predict(case: Case, device: str = "cpu") -> Breakdown:
    """The estimator's answer for `case` (from the config dict alone, no torch)."""
    return estimate(case.model_config(), case.run_config(), device=device, autocast=case.autocast,
                    target_tokens=case.answer or None)


def rel_error(predicted: int, measured: int) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


STEP_ROWS = ("step_peak_total", "step_peak_sum", "step_peak_phases")
"""On CUDA only: the allocator's peak for a whole step against the estimate's total (the sum of the
parts) and against its phase-by-phase peak, both less the CUDA context and the allocator slack,
which torch.cuda.max_memory_allocated does not count. Reported, not part of the ±10% goal."""


def compare(case: Case, device: str = "cpu") -> dict[str, tuple[int, int, float]]:
    """{part: (predicted, measured, relative error)} for every part of `case` (and, on CUDA, the
    whole step's peak)."""
    measured = measure(case, device)
    pred = predict(case, device)
    breakdown = pred.breakdown()
    rows = {}
    for part in PARTS:
        if part == "runtime":
            continue  # transients and (CUDA) fixed costs, not held tensors: checked by the step-peak rows
        rows[part] = (breakdown[part], measured[part], rel_error(breakdown[part], measured[part]))
    if "cpu_step_peak" in measured:
        # The whole step's peak against the estimate's total (its largest phase) and against the
        # sum of its parts: reported, not part of the ±10% goal.
        peak = measured["cpu_step_peak"]
        for name, value in (("step_peak_total", pred.total_bytes), ("step_peak_sum", pred.sum_bytes)):
            rows[name] = (value, peak, rel_error(value, peak))
    if "cuda_peak_allocated" in measured:
        rt = pred.details["runtime"]
        # Not in the measured peak: the context (outside the allocator), the slack (reserved, not
        # allocated) and the cuBLAS workspace (allocated once, before this case's baseline).
        unseen = rt["cuda_context"] + rt["allocator_slack"] + rt["cublas_workspace"]
        peak = measured["cuda_peak_allocated"]
        for name, value in (("step_peak_sum", pred.total_bytes), ("step_peak_phases", pred.details["peak_phases"]["peak"])):
            rows[name] = (value - unseen, peak, rel_error(value - unseen, peak))
        rows["cuda_context"] = (rt["cuda_context"], measured["cuda_context"], rel_error(rt["cuda_context"], measured["cuda_context"]))
        rows["cuda_preexisting"] = (rt["cublas_workspace"], measured["cuda_preexisting"], rel_error(rt["cublas_workspace"], measured["cuda_preexisting"]))
    return rows


def _fmt(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):7.2f}M"
    return f"{n / 1024:7.1f}K"


def main(argv: list[str] | None = None) -> int:
    import hub_kernels

    hub_kernels.switch_off()  # in the script only: the test suite imports this module
    argv = sys.argv[1:] if argv is None else argv
    if "--objectives" in argv:  # DPO, KTO and GRPO against real TRL steps (bench/estimate_objectives.py)
        import estimate_objectives

        return estimate_objectives.main([a for a in argv if a != "--objectives"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", action="store_true",
                        help="measure DPO, KTO and GRPO instead (bench/estimate_objectives.py; --only and --ci apply)")
    parser.add_argument("--quick", action="store_true", help="four configurations only")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--family", default="", help="run only this family's cases (a model_type, e.g. gemma2)")
    parser.add_argument("--ci", action="store_true", help="the test suite's slice (CI_SLICE)")
    parser.add_argument("--show-ctx", action="store_true", help="print tensors held as autograd ctx attributes")
    args = parser.parse_args(argv)
    estimate_measure.SHOW_CTX = args.show_ctx

    import logging
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    pool = QUICK if args.quick else CI_SLICE if args.ci else MATRIX
    cases = [c for c in pool if args.only in c.name and (not args.family or c.family == args.family)]
    if device == "cuda":
        # One-time allocations (cuBLAS workspaces, kernels' scratch) before the first baseline.
        x = torch.randn(256, 256, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
        torch.cuda.synchronize()
        del x
    worst: dict[str, tuple[float, str]] = {}
    family_worst: dict[str, tuple[float, str, str]] = {}
    start = time.perf_counter()
    failed_cases = []
    for case in cases:
        try:
            rows = compare(case, device)
        except Exception as exc:  # keep going: one broken configuration should not hide the rest
            print(f"\n{case.name}\n  FAILED: {type(exc).__name__}: {exc}")
            failed_cases.append(case.name)
            continue
        print(f"\n{case.name}")
        print(f"  {'part':<18}{'predicted':>10}{'measured':>10}{'error':>9}")
        for part, (pred, meas, err) in rows.items():
            if pred == 0 and meas == 0:
                continue
            goal = part in PARTS
            flag = "" if abs(err) <= TOLERANCE or not goal else "  <-- outside ±10%"
            print(f"  {part:<18}{_fmt(pred):>10}{_fmt(meas):>10}{err:>+9.2%}{flag}")
            if part not in worst or abs(err) > abs(worst[part][0]):
                worst[part] = (err, case.name)
            if goal and (case.family not in family_worst or abs(err) > abs(family_worst[case.family][0])):
                family_worst[case.family] = (err, part, case.name)
    print(f"\nworst relative error per part over {len(cases)} configurations on {device} ({time.perf_counter() - start:.0f} s):")
    failed = bool(failed_cases)
    for part, (err, name) in worst.items():
        goal = part in PARTS
        ok = abs(err) <= TOLERANCE
        failed |= goal and not ok
        verdict = ("ok  " if ok else "MISS") if goal else "info"
        print(f"  {part:<18}{err:>+9.2%}  {verdict}  ({name})")
    print("\nworst part per family:")
    for family, (err, part, name) in sorted(family_worst.items()):
        count = sum(1 for c in cases if c.family == family)
        print(f"  {family:<13}{part:<13}{err:>+8.2%}  over {count:>2} configurations  ({name})")
    for name in failed_cases:
        print(f"  FAILED to run: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
