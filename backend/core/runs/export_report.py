"""export_report.json: what was written, how it was checked, and what each stage cost.

Built by the export job once the check has run; the CLI and the studio read it back. The check's
time and memory are reported apart from the write's, since on a CPU the check can take longer
than writing the files.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core.registries.export_formats import EXPORT_REPORT, export_format

REPORT = EXPORT_REPORT
PASSED, FAILED, NOT_VERIFIED = "passed", "failed", "not verified"
OUTCOMES = (PASSED, FAILED, NOT_VERIFIED)
"""What a check, and so an export, came to. "not verified": the file is written and in place, but no
independent reader here could measure it; the report says which check to run elsewhere."""


def check_outcome(check: dict[str, Any]) -> str:
    """One check's outcome (reports written before `outcome` existed have only `passed` and `verified`)."""
    if check.get("outcome") in OUTCOMES:
        return check["outcome"]
    if check.get("verified") is False:
        return NOT_VERIFIED
    return PASSED if check.get("passed") else FAILED


def outcome_of(checks: list[dict[str, Any]]) -> str:
    """The export's outcome: failed when any check failed, else not verified when any could not run."""
    outcomes = {check_outcome(c) for c in checks}
    return FAILED if FAILED in outcomes else NOT_VERIFIED if NOT_VERIFIED in outcomes else PASSED


def report_outcome(report: dict[str, Any]) -> str:
    """The outcome of a whole export_report.json, old or new."""
    if report.get("outcome") in OUTCOMES:
        return report["outcome"]
    return outcome_of(report.get("checks") or []) if report.get("checks") else PASSED if report.get("passed") else FAILED


def verdict(outcome: str, checks: list[dict]) -> str:
    """The report's outcome in the words the CLI's verdict line uses."""
    if outcome == FAILED:
        return "FAILED " + ", ".join(c["name"] for c in checks if check_outcome(c) == FAILED)
    if outcome == NOT_VERIFIED:
        return "written, NOT VERIFIED (" + ", ".join(c["name"] for c in checks if check_outcome(c) == NOT_VERIFIED) + \
            ": no independent reader here)"
    return "passed"


def figure(check: dict[str, Any]) -> str:
    """A check's measured figure against its tolerance, for the one-line messages."""
    measured, tolerance = check["measured"], check["tolerance"]
    if check_outcome(check) == NOT_VERIFIED or not isinstance(measured, (int, float)) or isinstance(measured, bool):
        return str(measured)
    if check["name"] == "perplexity":
        shown = check.get("shown") or f"{measured:+.2%}"  # with its standard error and tokens (newer reports)
        short = "" if check.get("precise_enough", True) else "; standard error above a fifth of it"
        return f"{shown} (tolerance {tolerance:+.0%}{short})"
    if check["name"] == "top1" and isinstance(measured, float):
        return f"{measured:.1%} (tolerance {tolerance:.1%})"
    if isinstance(measured, float):
        return f"{measured:.3g} (tolerance {tolerance:g})"
    return f"{measured}"


@dataclass(frozen=True)
class ExportFacts:
    """What one export did, gathered by the export job: the report is built from these alone."""

    fmt: str
    dtype: str
    out: Path  # where the export will be once in place
    tmp: Path  # where it is written first
    run: Any  # the run exported (its folder, method, base_path)
    checks: list[dict]
    figures: dict
    reference: Any  # the trained model's perplexity on the probe
    probe: Any  # the probe data and its budget
    device: str
    notes: list[str]
    loaded_as: str
    seconds: float
    timings: dict[str, float]
    peaks: dict[str, int | None]  # peak RSS per stage
    anonymous: dict[str, int | None]  # peak anonymous memory per stage
    model_bytes: int
    rounding: dict[str, Any] | None
    check_dtype: str | None = None  # what it was measured in where that differs from dtype; "none": unreadable


def build_report(facts: ExportFacts) -> dict[str, Any]:
    """The report's fields, from what the export job gathered."""
    fmt, dtype, out, tmp, run = facts.fmt, facts.dtype, facts.out, facts.tmp, facts.run
    checks, figures, reference, probe, device = facts.checks, facts.figures, facts.reference, facts.probe, facts.device
    notes, loaded_as, seconds, timings = facts.notes, facts.loaded_as, facts.seconds, facts.timings
    peaks, anonymous, model_bytes, rounding = facts.peaks, facts.anonymous, facts.model_bytes, facts.rounding
    check_dtype = facts.check_dtype
    files = sorted((p for p in tmp.rglob("*") if p.is_file()), key=lambda p: str(p))
    listing = [{"name": str(p.relative_to(tmp)), "bytes": p.stat().st_size} for p in files]
    known = [v for v in peaks.values() if v]
    own = [v for v in anonymous.values() if v]
    outcome = outcome_of(checks)
    return {
        "format": fmt,
        "outcome": outcome,
        "passed": outcome == PASSED,
        "path": str(out),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(seconds, 2),
        "timings": {name: round(value, 2) for name, value in timings.items()},
        "run_dir": str(run.folder.path),
        "method": run.method,
        "base_model": str(run.base_path),
        "dtype": dtype if export_format(fmt).holds_dtype else None,
        "gguf_type": export_format(fmt).ggml_type,
        "files": listing,
        "total_bytes": sum(item["bytes"] for item in listing),
        "memory": {
            "model_16bit_bytes": model_bytes,
            "peak_rss_bytes": peaks,
            "peak_over_16bit": round(max(known) / model_bytes, 3) if known and model_bytes else None,
            "peak_anonymous_bytes": anonymous,
            "anonymous_over_16bit": round(max(own) / model_bytes, 3) if own and model_bytes else None,
            "what": "per stage: peak RSS (VmHWM, which counts the pages of a file transformers maps while it "
                    "reads it) and peak anonymous memory (RssAnon sampled every 20 ms: what the process "
                    "itself holds; mapped file pages are page cache the kernel takes back)",
        },
        "reference": {
            "what": f"the trained model: base as trained (quantized again for qlora/lora8) + adapter, unmerged, "
                    f"through peft, {dtype} on {device}",
            "perplexity": reference.perplexity,
            "tokens": reference.tokens,
            "data": probe.source,
            "budget": probe.describe(),
        },
        "check": {"device": device, "dtype": check_dtype or dtype, "seconds": round(timings.get("check", 0.0), 2),
                  "budget": probe.describe()},
        "loaded_as": loaded_as,
        "figures": figures,
        "rounding": rounding,
        "checks": checks,
        "notes": notes,
    }
