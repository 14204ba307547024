"""run_export: one run folder -> one export folder, written atomically and checked before it is called done.

Reads top to bottom as the job runs: check the request and the run folder (refusals before anything
loads), load the trained model (base as trained + adapter, unmerged, 16-bit) and measure it, free it,
write the export into a temporary folder one tensor at a time, reload what was written with the
library that owns the format (16-bit; a GGUF with 16-bit weights, fp32 activations) and measure it again, write
export_report.json, rename the folder into place. At most one model is in memory at any time. Each
check, and so the export, is passed, failed or not verified (no independent reader here: the report
says which to run elsewhere). JobFinished when none failed; otherwise the export is kept, its report
says which check failed and by how much, and the job ends with JobFailed naming that check and
figure and a format to try instead. A full disk, a stop or a crash removes the temporary folder:
an export folder is whole or absent.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.protocol import Capabilities, JobFinished, JobStarted, MetricsLogged, PhaseChanged
from backend.core.registries.export_formats import failure_hint, tolerance
from backend.core.runs.run_folder import RunFolder
from backend.core.runs.export_report import (FAILED, NOT_VERIFIED, PASSED, REPORT, ExportFacts, build_report,
                                             check_outcome, figure, verdict)
from backend.export.checkpoint_files import CheckpointFiles
from backend.export.doors.work import ExportWork, FormatWriter
from backend.export.memory import StagePeaks, release
from backend.export.merge import DTYPES, TrainedRun, check_device, default_dtype, load_tokenizer, load_trained, merged_source
from backend.jobs.export_target import Export, estimate_bytes, human_bytes
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)
STAGES = ("check", "load_model", "measure", "write", "verify", "report")
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def run_export(
    config: RunConfig,
    run_dir: Path,
    reporter: Reporter,
    stop: StopListener,
    *,
    resume: bool = False,
    capabilities: Capabilities | None = None,
    params: dict | None = None,
) -> None:
    began = time.monotonic()
    job = Export(Path(run_dir), params or {})
    peaks, timings = StagePeaks(), {}
    reporter.emit(JobStarted(job="export", run_dir=str(run_dir), max_steps=len(STAGES)))
    with peaks:  # its memory sampler stops however the job ends
        _export(config, Path(run_dir), reporter, stop, job, peaks, timings, began)


def _export(config: RunConfig, run_dir: Path, reporter: Reporter, stop: StopListener, job: Export,
            peaks: StagePeaks, timings: dict[str, float], began: float) -> None:
    def stage(name: str, detail: str) -> None:
        if stop.requested:
            raise JobError("cancelled", f"export cancelled before {name}; nothing was written")
        reporter.emit(PhaseChanged(phase=name, detail=detail))

    fmt = job.fmt
    stage("check", f"{fmt.name} -> {job.out}")
    peaks.start("setup")
    run = TrainedRun.check(Path(run_dir), config, fmt.name)
    job.dtype = job.dtype or default_dtype(run)
    job.check_target(run)
    fmt.refuse(run)  # a missing package or probe, before anything large is loaded
    tokenizer = load_tokenizer(run)
    dtype, device = DTYPES[job.dtype], check_device()
    # A GGUF writer takes fp32 merged tensors and rounds them once, to its own types (merge_precision).
    source = merged_source(run, DTYPES[fmt.merge_precision or job.dtype]) if fmt.merged else None
    work = ExportWork(fmt, run, tokenizer, source, job.dtype, device, job.calibration_samples,
                      progress=lambda step, total: reporter.emit(MetricsLogged(step=step, max_steps=total)),
                      should_stop=lambda: stop.requested,
                      note=lambda text: reporter.emit(PhaseChanged(phase="write", detail=text)))
    writer: FormatWriter = fmt.writer().Writer(work)
    needed = estimate_bytes(fmt, source, writer.planned_bytes)
    if job.free_bytes() < needed:
        raise job.disk_full(needed)

    from backend.export import verify

    probe = verify.build_probe(config, tokenizer, device, tolerance(fmt.name, job.dtype)[0], fmt.calibrated)
    stage("load_model", f"the trained model: {run.method} run, base {run.base_path.name} as trained "
                        f"({run.quantization or run.precision}) + {'full weights' if run.full else 'adapter'}, "
                        f"{job.dtype} on {device}")
    peaks.start("reference")
    clock = time.monotonic()
    reference = load_trained(run, dtype, device)
    stage("measure", f"the trained model on {probe.describe()}")
    expected = _measure(reference, probe, stop, "measuring the trained model; nothing was written")
    del reference
    release()
    timings["reference"] = time.monotonic() - clock
    log.info("trained model: perplexity %.4f over %d tokens in %.1f s", expected.perplexity, expected.tokens,
             timings["reference"])

    stage("write", f"{fmt.description} (about {human_bytes(needed)}) into {job.tmp.name}")
    peaks.start("write")
    clock = time.monotonic()
    job.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        job.tmp.mkdir()
        notes = _write(work, writer, job.tmp, reporter)
        timings["write"] = time.monotonic() - clock
        read_as = f"in {fmt.read_back_in}," if fmt.read_back_in else job.dtype
        stage("verify", f"reloading {job.tmp.name} as its loader would, {read_as} on {device}, and measuring it")
        peaks.start("check")
        clock = time.monotonic()
        checks, figures, loaded_as, check_dtype = _verify(work, job.tmp, probe, expected, stop)
        for check in checks:  # name the file where it will be once the folder is in place
            if check.get("how_to_verify"):
                check["how_to_verify"] = check["how_to_verify"].replace(str(job.tmp), str(job.out))
        timings["check"] = time.monotonic() - clock
        peaks.stop()
        rounding = _rounding(job, source, notes)
        report = build_report(ExportFacts(fmt=fmt.name, dtype=job.dtype, out=job.out, tmp=job.tmp, run=run,
                                          checks=checks, figures=figures, reference=expected, probe=probe,
                                          device=device, notes=notes, loaded_as=loaded_as,
                                          seconds=time.monotonic() - began, timings=timings, peaks=peaks.peaks,
                                          anonymous=peaks.anonymous, model_bytes=_model_bytes(source, run),
                                          rounding=rounding, check_dtype=check_dtype))
        stage("report", f"{REPORT}: {verdict(report['outcome'], checks)}")
        (job.tmp / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        job.place()
    except OSError as exc:
        shutil.rmtree(job.tmp, ignore_errors=True)
        if exc.errno in DISK_FULL:
            raise job.disk_full(needed) from None
        raise
    except BaseException:
        shutil.rmtree(job.tmp, ignore_errors=True)
        raise

    _record(run_dir, fmt.name, job.out, reporter)
    failed = [c for c in checks if check_outcome(c) == FAILED]
    if failed:
        first = failed[0]
        raise JobError(
            "bad_input",
            f"{fmt.name} export failed its {first['name']} check: {figure(first)}; "
            f"the files are kept in {job.out} with {REPORT} marked failed",
            failure_hint(fmt.name, job.dtype, run.method),
        )
    summary = "; ".join(f"{c['name']} {figure(c)}" for c in checks if check_outcome(c) == PASSED)
    if report["outcome"] == NOT_VERIFIED:
        how = next(c["how_to_verify"] for c in checks if check_outcome(c) == NOT_VERIFIED)
        reporter.emit(PhaseChanged(phase="not_verified", detail=f"{job.out}: written, not verified here; {how}"
                                                                + (f" (passed: {summary})" if summary else "")))
    else:
        reporter.emit(PhaseChanged(phase="verified", detail=f"{job.out}: {summary}"))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began,
                              adapter_path=None if fmt.merged else str(job.out)))


def _record(run_dir: Path, fmt: str, out: Path, reporter: Reporter) -> None:
    """Record the export's folder in the run (run_folder.EXPORTS_RECORD) for `serve`; the export is in place
    already, so a record that cannot be written is a note, not a failure."""
    try:
        RunFolder(run_dir).record_export(fmt, out)
    except OSError as exc:
        reporter.emit(PhaseChanged(phase="report", detail=f"note: {out} is not recorded in the run ({exc}); "
                                                          f"serve it by naming the folder itself"))


def _model_bytes(source: Any, run: TrainedRun) -> int:
    """The model's size in 16-bit, the yardstick of the report's memory figures."""
    if source is not None:
        return source.parameter_count() * 2
    return CheckpointFiles(run.base_path, run.config.model.allow_pickle).parameter_count() * 2


def _rounding(job: Export, source: Any, notes: list[str]) -> dict[str, Any] | None:
    """How much of the adapter's change the 16-bit rounding of a merged export erased (None: nothing rounded)."""
    stats = getattr(source, "rounding", None)
    if stats is None or not stats.tensors or stats.relative_error is None:
        return None
    error = stats.relative_error
    if error > 0.5:
        notes.append(f"{job.dtype} rounding of the merged weights is {error:.0%} of the adapter's change (L2): much "
                     "of this fine-tune is below half a rounding step of the base weights"
                     + ("; fp16 keeps 8x finer steps" if job.dtype == "bf16" else ""))
    return {"what": f"L2 norm of the {job.dtype} rounding error of the merged weights over that of the adapter's "
                    f"change, over the {stats.tensors} adapted tensors", "relative_error": error}


def _write(work: ExportWork, writer: FormatWriter, folder: Path, reporter: Reporter) -> list[str]:
    """The format's writer fills `folder`; returns the report's notes (a Stop while writing cancels)."""
    try:
        notes = writer.write(folder)
    except InterruptedError:
        raise JobError("cancelled", "export cancelled while writing; nothing was left behind") from None
    reporter.flush()
    run = work.run
    if run.quantization and work.fmt.merged:
        notes.append(f"the base was dequantized from the run's {run.quantization} weights before merging")
    if run.quantization and run.device == "cuda" and not torch.cuda.is_available():
        notes.append(f"the run quantized its base on cuda and this export did it again on the cpu, which can "
                     f"round a few {run.quantization} weights differently; the checks measure the result")
    return notes


def _measure(model: Any, probe: Any, stop: StopListener, when: str) -> Any:
    """The probe's figures for one model; a Stop during it cancels the export."""
    from backend.export import verify

    try:
        return verify.measure(model, probe, lambda: stop.requested)
    except InterruptedError:
        raise JobError("cancelled", f"export cancelled while {when}") from None


def _verify(work: ExportWork, folder: Path, probe: Any, expected: Any,
            stop: StopListener) -> tuple[list[dict], dict, str, str]:
    """Load what was written with the loader that owns the format (the format's verifier), measure it, free
    it, compare: (checks, figures, how it was loaded, the dtype it was measured in)."""
    from backend.export import verify

    verifier = work.fmt.verifier()
    max_increase, min_top1 = tolerance(work.fmt.name, work.dtype)  # the trained model's dtype bounds the difference
    model, loaded_as, check_dtype, reason = verifier.read_back(work, folder)
    if model is None:  # no independent reader for this file here: say so, never fall back to our own code
        return verifier.not_verified(work, folder, max_increase, reason), {}, loaded_as, check_dtype
    got = _measure(model, probe, stop, "checking it; nothing was left behind")
    del model
    release()
    figures = verify.compare(expected, got)
    measured = [verify.perplexity_check(figures, max_increase, probe.source), verify.top1_check(figures, min_top1)]
    checks = verifier.checks(work, folder, measured)
    summary = (f"top-1 agreement {figures['top1_agreement']:.1%} ({figures['positions']} positions), perplexity "
               f"{figures['export_perplexity']:.4g} vs {figures['reference_perplexity']:.4g}, max |logit diff| "
               f"{figures['max_abs_logit_diff']:.3g} on the prompts")
    return checks, figures, f"{loaded_as} ({summary})", check_dtype
