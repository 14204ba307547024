"""The one summary table bench/gpu_check.sh prints last, from the files its steps wrote in OUT.

A step that did not run or failed shows as such: the table never fills a gap with a figure.

    python bench/gpu_summary.py OUT_DIR               # the table
    python bench/gpu_summary.py OUT_DIR --profiles    # the top kernels where MFU is under 25%
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # backend.core.runs.export_report (torch-free)


VLM_PRESETS = (("Qwen2.5-VL-7B QLoRA (16 GB preset, one image a row)", "qlora_vl7b.json"),
               ("Gemma-3-4B LoRA (24 GB preset, one image a row)", "lora_gemma4b.json"))
"""The VLM presets' rows (GPU_CHECK_PARTS=vlm): "did not run" on a text-only check."""


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def gib(value) -> str:
    return f"{value / 2**30:.2f} GiB" if isinstance(value, (int, float)) and value else "n/a"


def times(value) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "n/a"


def steps_line(out: Path) -> dict[str, dict]:
    lines = (out / "steps.jsonl").read_text().splitlines() if (out / "steps.jsonl").is_file() else []
    return {s["step"]: s for s in (json.loads(line) for line in lines if line.strip())}


def preset_row(name: str, data: dict) -> str:
    if not data:
        return f"| {name} | did not run | | | | |"
    if not data.get("ok"):
        return f"| {name} | FAILED: {(data.get('train_tail') or '').splitlines()[-1:]} | | | | |"
    steady, predicted = data.get("steady") or {}, (data.get("estimate") or {}).get("total_bytes")
    mfu = steady.get("mfu")
    return (f"| {name} | predicted {gib(predicted)} | max allocated {gib(steady.get('cuda_max_allocated_bytes'))} "
            f"({times(data.get('measured_allocated_over_predicted'))}) | max reserved "
            f"{gib(steady.get('cuda_max_reserved_bytes'))} ({times(data.get('measured_reserved_over_predicted'))}) | "
            f"{steady.get('tokens_per_s', 0):,.0f} useful tok/s over steps {(steady.get('from_step') or 0) + 1}-{steady.get('to_step')}"
            f" | MFU {f'{mfu:.1%}' if mfu else 'n/a'} |")


def throughput_row(name: str, data: dict) -> str:
    if not data:
        return f"| {name} | did not run | | | | |"
    peaks = data.get("peaks", {})
    s, b = peaks.get("studio", {}), peaks.get("baseline", {})
    speed = data["studio_tokens_per_s"] / data["baseline_tokens_per_s"] if data.get("baseline_tokens_per_s") else None
    reserved = s.get("reserved") / b["reserved"] if s.get("reserved") and b.get("reserved") else None
    return (f"| {name} | studio {data['studio_tokens_per_s']:,.0f} vs bare {data['baseline_tokens_per_s']:,.0f} "
            f"useful tok/s | {times(speed)} (goal >= 1.5x) | reserved {gib(s.get('reserved'))} vs {gib(b.get('reserved'))}"
            f" | {times(reserved)} (goal <= 0.6x) | steps {data['warmup'] + 1}-{data['steps']} |")


def short(value, width: int = 90) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def export_row(name: str, report: dict, step: dict) -> str:
    """The CLI's verdict (a check that could not be run is "not verified", not passed) and its exit status."""
    if not report:
        return f"| export {name} | did not finish (rc {step.get('rc')}) | | | | |"
    from backend.core.runs.export_report import FAILED, NOT_VERIFIED, check_outcome, report_outcome

    checks = report.get("checks", [])
    verdict = {FAILED: "FAILED", NOT_VERIFIED: "WRITTEN, NOT VERIFIED"}.get(report_outcome(report), "PASSED")
    marks = "; ".join(f"{c.get('name')} {({FAILED: 'FAILED', NOT_VERIFIED: 'not verified'}).get(check_outcome(c), 'ok')}"
                      f" ({short(c.get('measured'), 40)})" for c in checks)
    timings = report.get("timings") or {}
    return (f"| export {name} | {verdict}, CLI exit {step.get('rc')} | {short(report.get('loaded_as', ''))} | {marks} | "
            f"{report.get('total_bytes', 0) / 1e9:.2f} GB | write {timings.get('write')} s, check "
            f"{timings.get('reference')} + {timings.get('check')} s |")


def within(card: dict) -> str:
    if card.get("within") is None:
        return f"not capped: {(card.get('cap') or {}).get('why', 'the hook did not run')}"
    return "within the cap" if card["within"] else "NOT within the cap"


def main(out: Path) -> str:
    env, steps = read(out / "env.json"), steps_line(out)
    rows = ["| what | result | | | | |", "|---|---|---|---|---|---|"]
    rows.append(f"| machine | {env.get('gpu', 'n/a')} | torch {env.get('torch')} | transformers {env.get('transformers')} "
                f"| peft {env.get('peft')}, bitsandbytes {env.get('bitsandbytes')} | CUDA context "
                f"{gib(env.get('context_bytes'))} |")
    tests = steps.get("gpu_tests", {})
    rows.append(f"| gpu tests | {tests.get('detail', 'did not run')} | rc {tests.get('rc')} | {tests.get('seconds')} s | | |")
    for model in read(out / "build.json").get("models", []):
        rows.append(f"| build {model['model']} | {model['params'] / 1e9:.2f} B params on {model['device']} | "
                    f"built {model['build_s']} s | with save {model['with_save_s']} s | | |")
    rows.append(preset_row("Llama-3.2-1B LoRA (12 GB preset)", read(out / "lora_1b.json")))
    rows.append(preset_row("Llama-3.1-8B QLoRA (16 GB preset)", read(out / "qlora_8b.json")))
    for model in read(out / "build_vlm.json").get("models", []):
        rows.append(f"| build {model['model']} ({model['family']}) | {model['params'] / 1e9:.2f} B params on "
                    f"{model['device']} | built {model['build_s']} s | with save {model['with_save_s']} s | "
                    f"rows: one {model['data']['image']} image, {model['data']['seq_len']} tokens | |")
    for name, file in VLM_PRESETS:
        rows.append(preset_row(name, read(out / file)))
    rows.append(throughput_row("steady LoRA 1B", read(out / "throughput_lora_1b.json")))
    rows.append(throughput_row("steady QLoRA 8B", read(out / "throughput_qlora_8b.json")))
    for fmt in ("merged", "gguf"):
        rows.append(export_row(fmt, read(out / f"export_{fmt}.json"), steps.get(f"export_{fmt}", {})))
    for name in ("lora_1b", "qlora_8b"):
        profile = out / f"{name}_profile.txt"
        mfu = ((read(out / f"{name}.json").get("steady") or {}).get("mfu"))
        if profile.is_file() and mfu is not None and mfu < 0.25:
            lines = profile.read_text().splitlines()
            top = [line[:70].strip() for line in lines[4:7] if line.strip()]
            key = lines[0].split("sorted by ")[-1] if lines else "?"
            rows.append(f"| profile {name} (MFU {mfu:.1%} < 25%): top 3 by {key} | "
                        + " | ".join(short(t, 60) for t in top[:3]) + f" | {profile.name} in the outputs | |")
    maxlen = read(out / "maxlen.json")
    if maxlen.get("skipped") or not maxlen:
        rows.append(f"| longest row (optional) | skipped: {maxlen.get('skipped', 'did not run')} | | | | |")
    for card in maxlen.get("cards", []):
        rows.append(f"| longest row, {card['gib']} GiB cap | seq_len {card.get('max_seq_len')} | "
                    f"{within(card)} | max reserved {gib(card.get('max_reserved_bytes'))} "
                    f"| {card.get('error') or ''} | |")
    wall = steps.pop("wall", {}).get("seconds")
    rows.append("| steps | " + ", ".join(f"{k} {v.get('seconds')}/{v.get('limit')} s (rc {v.get('rc')})"
                                        for k, v in steps.items()) + f" | wall {wall} s in all | | | |")
    return "\n".join(rows)


def profiles(out: Path, rows: int = 10) -> str:
    """The top kernels of each preset run whose steady-state MFU is under 25%, printed before the table."""
    parts = []
    for name in ("lora_1b", "qlora_8b"):
        mfu = (read(out / f"{name}.json").get("steady") or {}).get("mfu")
        profile = out / f"{name}_profile.txt"
        if profile.is_file() and mfu is not None and mfu < 0.25:
            parts.append(f"== {name}: MFU {mfu:.1%} at steady state; torch.profiler, "
                         + "\n".join(profile.read_text().splitlines()[:rows + 4]))
    return "\n".join(parts)


if __name__ == "__main__":
    print(profiles(Path(sys.argv[1])) if sys.argv[2:] == ["--profiles"] else main(Path(sys.argv[1])))
