"""run_export: one run folder -> one export folder, written atomically and checked before it is called done.

Reads top to bottom as the job runs: check the request and the run folder (refusals before anything
loads), load the trained model (base as trained + adapter, unmerged, 16-bit) and measure it, free it,
write the export into a temporary folder one tensor at a time, reload what was written with the
library that owns the format (16-bit; a GGUF in the precision it holds) and measure it again, write
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
from backend.export.checkpoint_files import CheckpointFiles
from backend.core.registries.export_formats import CALIBRATED, FORMATS, failure_hint, is_gguf, tolerance
from backend.export.calibrated.support import refuse
from backend.export.calibrated.writer import load_calibrated_export, write_calibrated
from backend.export.memory import StagePeaks, release
from backend.jobs.export_target import Export, estimate_bytes, human_bytes
from backend.export.merge import DTYPES, TrainedRun, check_device, default_dtype, load_tokenizer, load_trained, merged_source
from backend.core.runs.export_report import (FAILED, NOT_VERIFIED, PASSED, REPORT, ExportFacts, build_report, check_outcome,
                                       figure, verdict)
from backend.core.protocol import Capabilities, JobFinished, JobStarted, MetricsLogged, PhaseChanged
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

    stage("check", f"{job.fmt} -> {job.out}")
    peaks.start("setup")
    run = TrainedRun.check(Path(run_dir), config, job.fmt)
    job.dtype = job.dtype or default_dtype(run)
    job.check_target(run)
    _refuse_unsupported(job, run)
    tokenizer = load_tokenizer(run)
    dtype, device = DTYPES[job.dtype], check_device()
    source = gguf_export = None
    if job.fmt != "adapter":
        # GGUF writers take fp32 merged tensors and round them once, to their own type.
        source = merged_source(run, torch.float32 if is_gguf(job.fmt) else dtype)
    if is_gguf(job.fmt):
        from backend.export.gguf_writer import GgufExport

        gguf_export = GgufExport(source, tokenizer, job.fmt, config.name)
    needed = estimate_bytes(job.fmt, source, run, gguf_export.tensor_bytes if gguf_export else None)
    if job.free_bytes() < needed:
        raise job.disk_full(needed)

    from backend.export import verify

    probe = verify.build_probe(config, tokenizer, device)
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

    stage("write", f"{FORMATS[job.fmt]} (about {human_bytes(needed)}) into {job.tmp.name}")
    peaks.start("write")
    clock = time.monotonic()
    job.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        job.tmp.mkdir()
        notes = _write(job, run, source, tokenizer, gguf_export, reporter, stop)
        timings["write"] = time.monotonic() - clock
        read_as = "in the precision it holds," if is_gguf(job.fmt) else job.dtype
        stage("verify", f"reloading {job.tmp.name} as its loader would, {read_as} on {device}, and measuring it")
        peaks.start("check")
        clock = time.monotonic()
        checks, figures, loaded_as, check_dtype = _verify(job, run, tokenizer, probe, expected, device, stop)
        for check in checks:  # name the file where it will be once the folder is in place
            if check.get("how_to_verify"):
                check["how_to_verify"] = check["how_to_verify"].replace(str(job.tmp), str(job.out))
        timings["check"] = time.monotonic() - clock
        peaks.stop()
        rounding = _rounding(job, source, notes)
        report = build_report(ExportFacts(fmt=job.fmt, dtype=job.dtype, out=job.out, tmp=job.tmp, run=run,
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

    failed = [c for c in checks if check_outcome(c) == FAILED]
    if failed:
        first = failed[0]
        raise JobError(
            "bad_input",
            f"{job.fmt} export failed its {first['name']} check: {figure(first)}; "
            f"the files are kept in {job.out} with {REPORT} marked failed",
            failure_hint(job.fmt, job.dtype, run.method),
        )
    summary = "; ".join(f"{c['name']} {figure(c)}" for c in checks if check_outcome(c) == PASSED)
    if report["outcome"] == NOT_VERIFIED:
        how = next(c["how_to_verify"] for c in checks if check_outcome(c) == NOT_VERIFIED)
        reporter.emit(PhaseChanged(phase="not_verified", detail=f"{job.out}: written, not verified here; {how}"
                                                                + (f" (passed: {summary})" if summary else "")))
    else:
        reporter.emit(PhaseChanged(phase="verified", detail=f"{job.out}: {summary}"))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began,
                              adapter_path=str(job.out) if job.fmt == "adapter" else None))


def _refuse_unsupported(job: Export, run: TrainedRun) -> None:
    """Refusals that need a package or a probe, before anything large is loaded."""
    refuse(job.fmt, run)
    if is_gguf(job.fmt):
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise JobError("missing_dependency", f"{job.fmt}: GGUF export needs the gguf package, which is not installed",
                           "pip install gguf (or reinstall with the README's command)")
        from transformers import AutoConfig

        from backend.export.gguf_writer import check_architecture

        check_architecture(AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path,
                                                      trust_remote_code=run.config.model.trust_remote_code))
    if job.fmt.startswith("bnb-"):
        from backend.export.hf_writer import bnb_device, bnb_serialization_problem

        bits = 4 if job.fmt == "bnb-4bit" else 8
        problem = bnb_serialization_problem(bits, bnb_device())
        if problem:
            raise JobError("missing_dependency", f"{job.fmt}: this machine's bitsandbytes cannot save {bits}-bit "
                           f"models that reload correctly ({problem})", "export merged or a gguf format instead")


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


def _write(job: Export, run: TrainedRun, source: Any, tokenizer: Any, gguf_export: Any,
           reporter: Reporter, stop: StopListener) -> list[str]:
    from backend.export import hf_writer

    def progress(step: int, total: int) -> None:
        reporter.emit(MetricsLogged(step=step, max_steps=total))

    def should_stop() -> bool:
        return stop.requested

    notes: list[str] = []
    try:
        if job.fmt == "adapter":
            hf_writer.write_adapter(run, job.tmp)
        elif job.fmt == "merged":
            hf_writer.write_merged(source, run, tokenizer, job.tmp, job.dtype, progress, should_stop)
        elif job.fmt.startswith("bnb-"):
            bits = 4 if job.fmt == "bnb-4bit" else 8
            hf_writer.write_bnb(source, run, tokenizer, job.tmp, bits, job.dtype, progress, should_stop)
        elif job.fmt in CALIBRATED:
            notes += write_calibrated(job.fmt, source, run, tokenizer, job.tmp, job.dtype, job.calibration_samples,
                                      check_device(), progress, should_stop)
        else:
            from backend.export.modelfile import modelfile

            gguf_export.write(job.tmp / "model.gguf", progress=progress, should_stop=should_stop)
            text, note = modelfile(tokenizer)
            (job.tmp / "Modelfile").write_text(text, encoding="utf-8")
            notes.append(f"tensor types: {gguf_export.type_counts()}")
            if note:
                notes.append(note)
    except InterruptedError:
        raise JobError("cancelled", "export cancelled while writing; nothing was left behind") from None
    reporter.flush()
    if run.quantization and job.fmt != "adapter":
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


def _verify(job: Export, run: TrainedRun, tokenizer: Any, probe: Any, expected: Any,
            device: str, stop: StopListener) -> tuple[list[dict], dict, str, str]:
    """Load what was written with the loader that owns the format, measure it, free it, compare:
    (checks, figures, how it was loaded, the dtype it was measured in)."""
    from transformers import AutoTokenizer

    from backend.export import hf_writer, verify

    trust = run.config.model.trust_remote_code
    dtype = DTYPES[job.dtype]
    check_dtype = job.dtype  # a GGUF file is read back in the precision it holds (gguf_check.read_dtype)
    if job.fmt == "adapter":
        model = load_trained(run, dtype, device, adapter_dir=job.tmp)
        loaded_as = f"peft PeftModel.from_pretrained on the base as trained, {job.dtype} on {device}"
    elif is_gguf(job.fmt):
        from transformers import AutoConfig

        from backend.export import gguf_check

        path = job.tmp / "model.gguf"
        config = AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path, trust_remote_code=trust)
        model, loaded_as, reason = gguf_check.read_back(path, config, device)
        if model is None:  # no independent reader for this file here: say so, never fall back to our own code
            checks = [gguf_check.not_verified("perplexity", tolerance(job.fmt, job.dtype)[0], reason, path),
                      gguf_check.tokenizer_check(path, tokenizer)]
            return checks, {}, f"not verified by transformers: {reason}", "none"
        check_dtype = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[next(model.parameters()).dtype]
    elif job.fmt == "merged":
        model, loaded_as = hf_writer.load_merged_export(job.tmp, job.dtype, device, trust)
    elif job.fmt in CALIBRATED:
        model, loaded_as, check_dtype = load_calibrated_export(job.tmp, job.dtype, device, trust)
    else:
        model, loaded_as = hf_writer.load_bnb_export(job.tmp, 4 if job.fmt == "bnb-4bit" else 8, job.dtype, device,
                                                     trust)
    got = _measure(model, probe, stop, "checking it; nothing was left behind")
    del model
    release()
    figures = verify.compare(expected, got)
    max_increase, min_top1 = tolerance(job.fmt, job.dtype)  # the trained model's dtype bounds the difference
    checks = [verify.perplexity_check(figures, max_increase, probe.source), verify.top1_check(figures, min_top1)]
    if is_gguf(job.fmt):
        from backend.export import gguf_check

        for check in checks:
            check["verified"] = True
        checks.append(gguf_check.tokenizer_check(job.tmp / "model.gguf", tokenizer))
    else:
        checks.append(verify.tokenizer_check(tokenizer, AutoTokenizer.from_pretrained(job.tmp, trust_remote_code=trust)))
    summary = (f"top-1 agreement {figures['top1_agreement']:.1%} ({figures['positions']} positions), perplexity "
               f"{figures['export_perplexity']:.4g} vs {figures['reference_perplexity']:.4g}, max |logit diff| "
               f"{figures['max_abs_logit_diff']:.3g} on the prompts")
    return checks, figures, f"{loaded_as} ({summary})", check_dtype
