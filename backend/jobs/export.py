"""run_export: one run folder -> one export folder, written atomically and checked before it is called done.

Reads top to bottom as the job runs: check the request and the run folder (refusals before anything
loads), load the trained model (base as trained + adapter, fp32) and measure it, write the export
into a temporary folder, reload what was written with the library that owns the format and measure
it again, write export_report.json, rename the folder into place. JobFinished only when every check
passed; otherwise the export is kept, its report says which check failed and by how much, and the
job ends with JobFailed naming that check and figure. A full disk, a stop or a crash removes the
temporary folder: an export folder is whole or absent.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from backend.config import RunConfig
from backend.errors import JobError, bad_input
from backend.export.formats import DTYPES, FORMATS, GGUF_TYPES, LOGIT_TOLERANCE, PERPLEXITY_TOLERANCE, is_gguf
from backend.export.merge import TrainedRun, linear_parameter_count, load_reference, load_tokenizer, merge, parameter_count
from backend.protocol import Capabilities, JobFinished, JobStarted, MetricsLogged, PhaseChanged
from backend.runs import fsync_tree
from backend.worker.reporter import Reporter
from backend.worker.stop_listener import StopListener

log = logging.getLogger(__name__)
REPORT = "export_report.json"
STAGES = ("check", "load_model", "measure", "write", "verify", "report")
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


class Export:
    """The options of one export, parsed from StartJob.params, and its folders."""

    def __init__(self, run_dir: Path, params: dict[str, Any]):
        unknown = set(params) - {"format", "out", "overwrite", "dtype"}
        if unknown:
            raise bad_input(f"unknown export option(s) {sorted(unknown)}; known: format, out, overwrite, dtype")
        self.fmt = params.get("format")
        if self.fmt not in FORMATS:
            raise bad_input(f"export format {self.fmt!r} is not one of {', '.join(FORMATS)}")
        self.dtype = params.get("dtype") or "bf16"
        if self.dtype not in DTYPES:
            raise bad_input(f"export dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        self.overwrite = bool(params.get("overwrite", False))
        self.out = Path(params.get("out") or run_dir / "exports" / self.fmt).expanduser().absolute()
        self.tmp = self.out.with_name(f".{self.out.name}.partial-{os.getpid()}")

    def check_target(self, run: TrainedRun) -> None:
        """Refuse an existing export (without overwrite) and any folder that holds the run's own files."""
        out = self.out.resolve()
        protected = [run.folder.path, run.weights_dir, run.base_path, run.folder.checkpoints_dir]
        for path in protected:
            path = path.resolve()
            if out == path or out in path.parents or (path != run.folder.path.resolve() and path in out.parents):
                raise bad_input(f"{self.out} would overwrite the run's own files ({path}); pick another --out")
        if self.out.exists():
            if not self.out.is_dir():
                raise bad_input(f"{self.out} exists and is a file; pick another --out")
            if not self.overwrite:
                raise bad_input(f"{self.out} already holds an export; pass --overwrite to replace it, "
                                "or --out to write somewhere else")
        for stale in self.out.parent.glob(f".{self.out.name}.partial-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and _alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)  # left by an export that was killed

    def free_bytes(self) -> int:
        probe = self.out.parent
        while not probe.exists():
            probe = probe.parent
        return shutil.disk_usage(probe).free

    def disk_full(self, needed: int) -> JobError:
        return JobError(
            "disk_full",
            f"the disk holding {self.out.parent} is full: this {self.fmt} export needs about {_human(needed)} free "
            f"and {_human(self.free_bytes())} is free now; nothing was left behind",
            "free some space there, or pass --out on a disk with more room",
        )

    def place(self) -> None:
        """Rename the finished temporary folder into place (replacing the old export when overwriting)."""
        fsync_tree(self.tmp)
        old = None
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def estimate_bytes(fmt: str, model: Any, run: TrainedRun, gguf_bytes: int | None = None) -> int:
    """Disk the export needs while it is written (the bnb formats also hold a 16-bit scratch copy)."""
    params = parameter_count(model)
    linear = linear_parameter_count(model)
    sixteen = params * 2
    if fmt == "adapter":
        size = sum(p.stat().st_size for p in run.weights_dir.iterdir() if p.is_file())
    elif fmt == "merged":
        size = sixteen
    elif fmt == "bnb-8bit":
        size = sixteen + linear * 1 + (params - linear) * 2
    elif fmt == "bnb-4bit":
        size = sixteen + int(linear * 0.53) + (params - linear) * 2
    else:
        size = gguf_bytes or sixteen
    return int(size * 1.05) + 1024 * 1024  # tokenizer, metadata, report


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
    reporter.emit(JobStarted(job="export", run_dir=str(run_dir), max_steps=len(STAGES)))

    def stage(name: str, detail: str) -> None:
        if stop.requested:
            raise JobError("cancelled", f"export cancelled before {name}; nothing was written")
        reporter.emit(PhaseChanged(phase=name, detail=detail))

    stage("check", f"{job.fmt} -> {job.out}")
    run = TrainedRun.check(Path(run_dir), config, job.fmt)
    job.check_target(run)
    if is_gguf(job.fmt):
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise JobError("missing_dependency", f"{job.fmt}: GGUF export needs the gguf package, which is not installed",
                           "pip install gguf (or reinstall with the README's command)")
        from transformers import AutoConfig

        from backend.export.gguf_writer import check_architecture

        check_architecture(AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path))
    if job.fmt.startswith("bnb-"):
        from backend.export.hf_writer import bnb_device, bnb_serialization_problem

        bits = 4 if job.fmt == "bnb-4bit" else 8
        problem = bnb_serialization_problem(bits, bnb_device())
        if problem:
            raise JobError("missing_dependency", f"{job.fmt}: this machine's bitsandbytes cannot save {bits}-bit "
                           f"models that reload correctly ({problem})", "export merged or a gguf format instead")

    stage("load_model", f"{run.method} run: base {run.base_path.name} as trained ({run.quantization or run.precision}) + "
                        f"{'full weights' if run.full else 'adapter'}, fp32")
    tokenizer = load_tokenizer(run)
    reference = load_reference(run)

    from backend.export import verify

    probe = verify.build_probe(config, tokenizer)
    stage("measure", f"the trained model on {len(probe.prompts)} fixed prompts and {probe.source}")
    pad_id = tokenizer.pad_token_id
    expected = verify.measure(reference, probe, pad_id)
    log.info("trained model: perplexity %.4f over %d tokens", expected.perplexity, expected.tokens)

    model = reference if job.fmt == "adapter" else merge(reference)
    gguf_export = None
    if is_gguf(job.fmt):
        from backend.export.gguf_writer import GgufExport
        from backend.export.tensor_source import StateDictSource

        gguf_export = GgufExport(StateDictSource(model), tokenizer, job.fmt, config.name)
    needed = estimate_bytes(job.fmt, model, run, gguf_export.tensor_bytes if gguf_export else None)
    if job.free_bytes() < needed:
        raise job.disk_full(needed)

    stage("write", f"{FORMATS[job.fmt]} (about {_human(needed)}) into {job.tmp.name}")
    job.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        job.tmp.mkdir()
        notes = _write(job, run, model, tokenizer, gguf_export, reporter, stop)
        del model, reference, gguf_export
        stage("verify", f"reloading {job.tmp.name} as its loader would and measuring it")
        checks, loaded_as = _verify(job, run, tokenizer, probe, expected)
        report = _report(job, run, checks, expected, probe, notes, loaded_as, time.monotonic() - began)
        stage("report", f"{REPORT}: {'passed' if report['passed'] else 'FAILED'}")
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

    failed = [c for c in checks if not c["passed"]]
    if failed:
        first = failed[0]
        hint = "try a higher-precision format (merged, gguf-q8_0, bnb-8bit) or see the report"
        if run.method == "qlora" and job.fmt == "bnb-4bit":
            hint = ("a QLoRA adapter's changes are finer than the NF4 grid its base was trained on, so quantizing "
                    "the merged model to NF4 again rounds most of them away; serve the adapter on the 4-bit base "
                    "(format adapter) or export bnb-8bit, gguf-q8_0 or gguf-q4_0")
        raise JobError(
            "bad_input",
            f"{job.fmt} export failed its {first['name']} check: {_figure(first)}; "
            f"the files are kept in {job.out} with {REPORT} marked failed",
            hint,
        )
    summary = "; ".join(f"{c['name']} {_figure(c)}" for c in checks)
    reporter.emit(PhaseChanged(phase="verified", detail=f"{job.out}: {summary}"))
    reporter.emit(JobFinished(run_dir=str(run_dir), seconds=time.monotonic() - began,
                              adapter_path=str(job.out) if job.fmt == "adapter" else None))


def _figure(check: dict[str, Any]) -> str:
    measured, tolerance = check["measured"], check["tolerance"]
    if check["name"] == "perplexity":
        return f"{measured:+.2%} (tolerance {tolerance:+.0%})"
    if isinstance(measured, float):
        return f"{measured:.3g} (tolerance {tolerance:g})"
    return f"{measured}"


def _write(job: Export, run: TrainedRun, model: Any, tokenizer: Any, gguf_export: Any,
           reporter: Reporter, stop: StopListener) -> list[str]:
    from backend.export import hf_writer

    notes: list[str] = []
    if job.fmt == "adapter":
        hf_writer.write_adapter(run, job.tmp)
    elif job.fmt == "merged":
        hf_writer.write_merged(model, tokenizer, job.tmp, job.dtype)
    elif job.fmt.startswith("bnb-"):
        hf_writer.write_bnb(model, tokenizer, job.tmp, 4 if job.fmt == "bnb-4bit" else 8, job.dtype)
    else:
        from backend.export.modelfile import modelfile

        def progress(step: int, total: int) -> None:
            reporter.emit(MetricsLogged(step=step, max_steps=total))

        try:
            gguf_export.write(job.tmp / "model.gguf", progress=progress, should_stop=lambda: stop.requested)
        except InterruptedError:
            raise JobError("cancelled", "export cancelled while writing; nothing was left behind") from None
        reporter.flush()
        text, note = modelfile(tokenizer)
        (job.tmp / "Modelfile").write_text(text, encoding="utf-8")
        notes.append(f"tensor types: {gguf_export.type_counts()}")
        if note:
            notes.append(note)
    if run.quantization and job.fmt != "adapter":
        notes.append(f"the base was dequantized from the run's {run.quantization} weights before merging")
    if run.quantization and run.device == "cuda" and not torch.cuda.is_available():
        notes.append(f"the run quantized its base on cuda and this export did it again on the cpu, which can "
                     f"round a few {run.quantization} weights differently; the checks measure the result")
    return notes


def _verify(job: Export, run: TrainedRun, tokenizer: Any, probe: Any, expected: Any) -> tuple[list[dict], str]:
    from transformers import AutoTokenizer

    from backend.export import hf_writer, verify

    pad_id = tokenizer.pad_token_id
    if job.fmt == "adapter":
        model = hf_writer.load_adapter_export(run, job.tmp)
        got = verify.measure(model, probe, pad_id)
        exported_tokenizer = AutoTokenizer.from_pretrained(job.tmp)
        checks = [verify.logit_check(expected, got, LOGIT_TOLERANCE["adapter"])]
        loaded_as = "peft PeftModel on the base as trained"
    elif is_gguf(job.fmt):
        from transformers import AutoConfig

        from backend.export.gguf_check import check_gguf

        source_config = AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path)
        return check_gguf(job.tmp / "model.gguf", source_config, tokenizer, probe, expected, job.fmt)
    elif job.fmt == "merged":
        model, loaded_as = hf_writer.load_merged_export(job.tmp, job.dtype)
        got = verify.measure(model, probe, pad_id)
        exported_tokenizer = AutoTokenizer.from_pretrained(job.tmp)
        checks = [verify.logit_check(expected, got, LOGIT_TOLERANCE[f"merged:{job.dtype}"])]
    else:
        bits = 4 if job.fmt == "bnb-4bit" else 8
        model, loaded_as = hf_writer.load_bnb_export(job.tmp, bits)
        got = verify.measure(model, probe, pad_id)
        exported_tokenizer = AutoTokenizer.from_pretrained(job.tmp)
        checks = [verify.perplexity_check(expected, got, PERPLEXITY_TOLERANCE[job.fmt], probe.source)]
    checks.append(verify.tokenizer_check(tokenizer, exported_tokenizer))
    return checks, f"{loaded_as} ({got_figures(expected, got)})"


def got_figures(expected: Any, got: Any) -> str:
    from backend.export import verify

    logits = verify.logit_figures(expected, got)
    ppl = verify.perplexity_figures(expected, got)
    return (f"max |logit diff| {logits['max_abs_logit_diff']:.3g}, top-1 agreement {logits['top1_agreement']:.1%}, "
            f"perplexity {ppl['export_perplexity']:.4g} vs {ppl['reference_perplexity']:.4g}")


def _report(job: Export, run: TrainedRun, checks: list[dict], expected: Any, probe: Any, notes: list[str],
            loaded_as: str, seconds: float) -> dict[str, Any]:
    files = sorted((p for p in job.tmp.rglob("*") if p.is_file()), key=lambda p: str(p))
    listing = [{"name": str(p.relative_to(job.tmp)), "bytes": p.stat().st_size} for p in files]
    return {
        "format": job.fmt,
        "passed": all(c["passed"] for c in checks),
        "path": str(job.out),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 2),
        "run_dir": str(run.folder.path),
        "method": run.method,
        "base_model": str(run.base_path),
        "dtype": job.dtype if job.fmt in ("merged", "bnb-4bit", "bnb-8bit") else None,
        "gguf_type": GGUF_TYPES.get(job.fmt),
        "files": listing,
        "total_bytes": sum(item["bytes"] for item in listing),
        "reference": {
            "what": "the trained model: base as trained (dequantized for qlora/lora8) + adapter, fp32",
            "perplexity": expected.perplexity,
            "tokens": expected.tokens,
            "data": probe.source,
        },
        "loaded_as": loaded_as,
        "checks": checks,
        "notes": notes,
    }
