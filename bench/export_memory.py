"""Peak memory and time of every export format for a ~1 B Llama, the check included.

Builds a random-weight Llama with TinyLlama-1.1B's dimensions (hidden 2048, intermediate 5632, 22
layers, 32 heads, 4 KV heads, vocabulary 32000, untied; the config is read from
tests/fixtures/model_configs/TinyLlama--TinyLlama-1.1B-Chat-v1.0/config.json),
saved in bf16 with the bundled tokenizer, runs a 2-step LoRA fine-tune through the real `train`
command, then exports it in every format, each in its own process (so peaks do not mix), through
the export job itself. Prints one table: wall time, the write's and the check's time (the check is
the trained model's measurement plus the export's), peak resident memory as a multiple of the
model's 16-bit size, and which stage peaked. The peaks come from VmHWM (Linux), reset by the job
at each stage, and beside them the peak anonymous memory (RssAnon sampled every 20 ms): VmHWM also
counts the pages of the GGUF file transformers maps while its check reads it back. The goal (GOAL) is
on anonymous memory beyond the process's baseline after its imports, which the table also gives.

    python bench/export_memory.py                        # everything, in a temporary folder
    python bench/export_memory.py --work /tmp/em --keep  # keep the model, run and exports
    python bench/export_memory.py --formats merged gguf-q8_0
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import hub_kernels  # noqa: E402

hub_kernels.switch_off()  # the workers it starts inherit it
CONFIG_NAME = "TinyLlama--TinyLlama-1.1B-Chat-v1.0"
CONFIG = ROOT / "tests" / "fixtures" / "model_configs" / CONFIG_NAME / "config.json"
KEYS = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
            num_key_value_heads=4, vocab_size=32000, rms_norm_eps=1e-5, rope_theta=10000.0,
            max_position_embeddings=2048, tie_word_embeddings=False)
FORMATS = ["adapter", "merged", "gguf-f16", "gguf-q8_0", "gguf-q4_0", "bnb-8bit", "bnb-4bit"]


def model_overrides() -> tuple[dict, str]:
    """The dimensions of TinyLlama's published config.json (KEYS names them, with its values)."""
    raw = json.loads(CONFIG.read_text())
    return {k: raw[k] for k in KEYS}, str(CONFIG.relative_to(ROOT))


def build(folder: Path, layers: int | None) -> None:
    """Child process: the random-weight model, bf16, with the bundled tokenizer (tests/families.py)."""
    from tests.families import build_tiny_model

    values, _ = model_overrides()
    if layers:
        values["num_hidden_layers"] = layers
    theta = values.pop("rope_theta")
    values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    build_tiny_model("llama", folder, seed=0, dtype="bfloat16",
                     rope_parameters={"rope_type": "default", "rope_theta": theta}, **values)


def one(fmt: str, run_dir: Path, out: Path) -> None:
    """Child process: one export through run_export; prints a JSON line with what the parent needs."""
    import torch

    from backend.core.errors import JobError
    from backend.export.memory import anonymous_bytes, peak_rss_bytes
    from backend.jobs.export import run_export
    from backend.core.runs.run_folder import RunFolder
    from backend.runtime.reporter import Reporter
    from backend.runtime.stop_listener import StopListener

    import peft  # noqa: F401  (imported before the baseline is read: their code is not the export's memory)
    import transformers  # noqa: F401

    torch.set_num_threads(os.cpu_count() or 1)
    folder = RunFolder(run_dir)
    config = folder.load_config()
    baseline, baseline_anonymous = peak_rss_bytes(), anonymous_bytes()
    began = time.monotonic()
    error = None
    try:
        run_export(config, folder.path, Reporter(io.StringIO()), StopListener(io.StringIO()),
                   params={"format": fmt, "out": str(out), "overwrite": True})
    except JobError as exc:
        error = f"{exc.kind}: {exc.message}"
    print("RESULT " + json.dumps({"wall": time.monotonic() - began, "baseline": baseline,
                                   "baseline_anonymous": baseline_anonymous, "end_peak": peak_rss_bytes(),
                                   "error": error}))


def run_child(*args: str, env: dict) -> str:
    done = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the model, the run and the exports")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--layers", type=int, help="fewer layers than 22, for a quick try of the bench itself")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--one", nargs=3, metavar=("FORMAT", "RUN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build(args.build, args.layers)
        return 0
    if args.one:
        one(args.one[0], Path(args.one[1]), Path(args.one[2]))
        return 0

    work = args.work or Path(tempfile.mkdtemp(prefix="export-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    _, config_from = model_overrides()
    model = work / "model"
    began = time.monotonic()
    if not (model / "model.safetensors").is_file():
        run_child("--build", str(model), *(["--layers", str(args.layers)] if args.layers else []), env=env)
    print(f"model: {model} (config from {config_from}), built in {time.monotonic() - began:.0f} s", flush=True)
    began = time.monotonic()
    train = subprocess.run(
        [sys.executable, "-m", "backend.cli", "train", str(ROOT / "resources/presets/tiny_lora.yaml"),
         "--set", f"model.path={model}", "--set", "train.max_steps=2", "--set", "train.seq_len=64",
         "--set", "train.micro_batch_size=2", "--set", "train.save_steps=100", "--set", "name=bench-1b"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    found = re.search(r"adapter:\s+(\S+)/adapter", train.stdout)
    if train.returncode != 0 or not found:
        raise SystemExit(f"training failed:\n{train.stdout[-2000:]}\n{train.stderr[-2000:]}")
    run_dir = Path(found.group(1))
    print(f"run: {run_dir} (2 LoRA steps, seq_len 64), trained in {time.monotonic() - began:.0f} s", flush=True)

    rows = []
    for fmt in args.formats:
        out = work / "exports" / fmt
        stdout = run_child("--one", fmt, str(run_dir), str(out), env=env)
        result = json.loads(stdout.split("RESULT ", 1)[1])
        report_path = out / "export_report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else None
        rows.append((fmt, result, report))
        print(f"  {fmt}: {result['wall']:.0f} s {result['error'] or ''}", flush=True)
        shutil.rmtree(out, ignore_errors=True)
    (work / "export_memory.json").write_text(json.dumps([{"format": f, "result": r, "report": p} for f, r, p in rows],
                                                        indent=2))
    print(table(rows))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


GOAL = 1.5
"""The memory goal: every stage's peak anonymous memory beyond the process's baseline after its imports
(torch, transformers, peft and the export job's modules) at most this many times the model's 16-bit size."""


def beyond_baseline(own: dict, baseline: int | None, size: int) -> str:
    """The highest stage's anonymous peak less the post-import baseline, as a multiple of the 16-bit size."""
    if not own or not baseline:
        return "?"
    stage = max(own, key=own.get)
    return f"{(own[stage] - baseline) / size:.2f}x ({stage})"


def table(rows: list) -> str:
    from backend.core.runs.export_report import report_outcome
    from backend.core.runs.export_report import verdict as report_verdict

    lines = ["| format | wall s | write s | check s (trained + export) | peak RSS GB | peak / 16-bit size | "
             "peak stage | peak anonymous / 16-bit size | anonymous beyond baseline / 16-bit size | "
             "write: anonymous beyond baseline / 16-bit size | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fmt, result, report in rows:
        if report is None:
            lines.append(f"| {fmt} | {result['wall']:.0f} | | | | | | | | | refused: {result['error']} |")
            continue
        peaks = {k: v for k, v in report["memory"]["peak_rss_bytes"].items() if v}
        size = report["memory"]["model_16bit_bytes"]
        peak = max([*peaks.values(), result["end_peak"] or 0])
        stage = max(peaks, key=peaks.get) if peaks else "?"
        own = {k: v for k, v in (report["memory"].get("peak_anonymous_bytes") or {}).items() if v}
        anonymous = f"{max(own.values()) / size:.2f}x ({max(own, key=own.get)})" if own else "?"
        base = result.get("baseline_anonymous")
        beyond = beyond_baseline(own, base, size)
        write = f"{(own['write'] - base) / size:.2f}x" if base and "write" in own else "?"
        t = report["timings"]
        check = t.get("reference", 0) + t.get("check", 0)
        verdict = report_verdict(report_outcome(report), report["checks"])
        lines.append(f"| {fmt} | {result['wall']:.0f} | {t.get('write', 0):.0f} | {check:.0f} "
                     f"({t.get('reference', 0):.0f} + {t.get('check', 0):.0f}) | {peak / 1e9:.2f} | "
                     f"{peak / size:.2f}x | {stage} | {anonymous} | {beyond} | {write} | {verdict} |")
    first = next((r for _, _, r in rows if r), None)
    if first:
        base = rows[0][1].get("baseline_anonymous")
        lines.append(f"\n16-bit size {first['memory']['model_16bit_bytes'] / 1e9:.2f} GB; process baseline after "
                     f"imports {rows[0][1]['baseline'] / 1e9:.2f} GB peak RSS"
                     + (f", {base / 1e9:.2f} GB anonymous" if base else "")
                     + f"; goal: anonymous beyond that baseline <= {GOAL}x the 16-bit size; "
                     f"check budget: {first['check']['budget']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
