"""`finetune-studio export RUN_DIR --format F`: run an export in a worker and show its checks.

Torch-free, like the rest of the CLI: the export runs in `python -m backend.worker` (the job
backend/jobs/export.py), this side prints its progress and then the checks from export_report.json.
The exit status is 0 only when the export was written AND every check passed; a failed check is
printed with its figure and exits 1, a refusal (an unfinished run, before a worker starts; an existing
export, the worker's sentence) exits 2, as a bad command line does. An export no independent reader here could check
("not verified": written and in place, the report says which check to run elsewhere) exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from backend.cli.checks import open_run_folder, output_folder, refuse_unfinished, refuse_vision_format
from backend.core.registries.export_formats import (CALIBRATED_VISION, DTYPES, EXPORT_FORMATS, FORMATS, GGUF_VISION,
                                                    export_format, format_names)
from backend.core.runs.export_report import FAILED, NOT_VERIFIED, PASSED, REPORT, check_outcome, report_outcome


def add_export_parser(subparsers: Any) -> argparse.ArgumentParser:
    formats = "\n".join(f"  {name:10} {what}" for name, what in FORMATS.items())
    every_family = [f.name for f in EXPORT_FORMATS.values() if f.vision_gap is None and f.vision_families is None]
    parser = subparsers.add_parser(
        "export", help=f"export a finished run ({format_names()}) and verify it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write one export of a run into a temporary folder, reload it with the library that owns the\n"
                    "format, check it against the trained model, and only then put it in place with its\n"
                    f"export_report.json. Exit status 0 when no check failed (a check no reader here can run is\n"
                    f"\"not verified\", and the report says which to run elsewhere).\n\nformats:\n{formats}\n\n"
                    f"a vision-language run exports as {', '.join(every_family)} (its tower and projector\n"
                    f"16-bit); GGUF for {', '.join(GGUF_VISION)} (the language model plus llama.cpp's\n"
                    f"mmproj file), gptq/awq/w8a8 for {', '.join(CALIBRATED_VISION)};\n"
                    "another family's run is refused in one line",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (printed by `train`, listed by `runs list`)")
    parser.add_argument("--format", required=True, choices=list(FORMATS), help="what to write")
    parser.add_argument("--out", metavar="DIR", help="export folder (default: RUN_DIR/exports/FORMAT)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export in that folder")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="16-bit type of merged and bnb exports, and of the check (default: the base's own; "
                             "bf16 for an fp32 base)")
    parser.add_argument("--calibration-samples", type=int, metavar="N", default=None,
                        help="rows of the run's training data gptq-int4, awq-int4 and w8a8 calibrate on (default 128)")
    parser.set_defaults(func=cmd_export)
    return parser


def _progress(event: dict[str, Any], out: TextIO) -> None:
    kind = event["type"]
    clear = "\r\033[K" if out.isatty() else ""
    if kind == "PhaseChanged" and event["phase"] not in ("verified", "not_verified"):
        out.write(f"{clear}[{event['phase']}] {event.get('detail', '')}\n")
    elif kind == "MetricsLogged":
        step, total = event["step"], max(event["max_steps"], 1)
        bar = "#" * int(30 * step / total)
        text = f"[{bar:.<30}] tensor {step}/{total}"
        if out.isatty():
            out.write("\r\033[K" + text)
        elif step == total:
            out.write(text + "\n")
    out.flush()


def _format_measured(check: dict[str, Any]) -> tuple[str, str]:
    measured, tolerance = check.get("measured"), check.get("tolerance")
    if check.get("name") == "perplexity" and isinstance(measured, (int, float)):
        figures = check.get("figures", {})
        return (f"{measured:+.2%} ({figures.get('export_perplexity', 0):.4g} vs {figures.get('reference_perplexity', 0):.4g})",
                f"<= {tolerance:+.0%}")
    if check.get("name") == "top1" and isinstance(measured, (int, float)):
        return f"{measured:.1%}", f">= {tolerance:.1%}"
    if isinstance(measured, float):
        return f"{measured:.4g}", f"<= {tolerance:g}"
    if check.get("name") == "perplexity" and isinstance(tolerance, float):  # not verified: the figure it would meet
        return str(measured), f"<= {tolerance:+.0%}"
    return str(measured), str(tolerance)


def print_report(report: dict[str, Any], out: TextIO) -> None:
    verdict = {PASSED: "PASSED", FAILED: "FAILED", NOT_VERIFIED: "WRITTEN, NOT VERIFIED"}[report_outcome(report)]
    lines = [f"{verdict}: {report.get('format')} export in {report.get('path')}",
             f"  size:      {report.get('total_bytes', 0) / 1e6:.1f} MB in {len(report.get('files', []))} files",
             f"  loaded as: {report.get('loaded_as', '')}"]
    timings = report.get("timings") or {}
    if timings:
        lines.append(f"  time:      write {timings.get('write', 0):.1f} s, check {timings.get('reference', 0):.1f} s "
                     f"(trained model) + {timings.get('check', 0):.1f} s (export)")
    for check in report.get("checks", []):
        measured, tolerance = _format_measured(check)
        outcome = check_outcome(check)
        open_ = outcome == NOT_VERIFIED
        mark = {PASSED: "ok  ", FAILED: "FAIL", NOT_VERIFIED: "----"}[outcome]
        lines.append(f"  {mark} {check.get('name', ''):11} {measured}  (tolerance {tolerance})")
        if open_ and check.get("how_to_verify"):
            lines.append(f"       to check it elsewhere: {check['how_to_verify']}")
    for note in report.get("notes", []):
        lines.append(f"  note: {note}")
    out.write("\n".join(lines) + "\n")


def cmd_export(args: argparse.Namespace) -> int:
    from backend.cli.worker_process import WorkerProcess

    folder = open_run_folder(args.run_dir)
    args.run_folder = folder.path  # an internal error's traceback goes to its worker.log
    config = folder.load_config()
    out = output_folder(args.out, "--out") if args.out else folder.path / "exports" / args.format  # the argument first
    refuse_unfinished(folder, config, export_format(args.format).merged, "export")  # before a worker starts
    refuse_vision_format(config, args.format)
    params = {"format": args.format, "out": str(out), "overwrite": bool(args.overwrite)}
    if args.dtype:
        params["dtype"] = args.dtype
    if args.calibration_samples is not None:
        params["calibration_samples"] = args.calibration_samples
    err = sys.stderr
    err.write(f"exporting {folder.path} as {args.format} -> {out}\n")
    started = time.time()
    terminal = WorkerProcess(job="export", params=params).run(folder, config, on_event=lambda e: _progress(e, err))
    err.write("\n" if err.isatty() else "")
    report_path = out / REPORT
    report = None
    try:
        # A report older than this command belongs to an earlier export (this one was refused).
        if report_path.stat().st_mtime >= started - 1:
            report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        report = None
    fresh = report is not None
    if fresh:
        print_report(report, sys.stdout)
    if terminal["type"] == "JobFinished" and fresh and report_outcome(report) in (PASSED, NOT_VERIFIED):
        return 0
    if terminal["type"] == "JobFailed":
        print(f"error: {terminal['message']}", file=sys.stderr)
        if terminal.get("hint"):
            print(f"hint: {terminal['hint']}", file=sys.stderr)
        if terminal.get("kind") == "bad_input" and not fresh:
            return 2  # refused before anything was written, as every bad input (a failed check is 1)
    elif not fresh:
        print(f"error: the export finished but {report_path} is missing or unreadable", file=sys.stderr)
    return 1
