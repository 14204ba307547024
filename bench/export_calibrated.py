"""Time and peak memory of the calibrated exports (gptq-int4, awq-int4, w8a8) beside the merged export.

Trains the bundled model with resources/presets/tiny_lora.yaml (or, with --layers N, a random-weight
Llama with TinyLlama-1.1B's widths and N layers, built as bench/export_memory.py builds it), then runs
each export in its own process through the export job (bench/export_memory.py's child), so peaks do not
mix, and prints bench/export_memory.py's table: wall, write and check seconds, peak RSS and peak
anonymous memory as multiples of the model's 16-bit size, and the anonymous peak beyond the process's
baseline after its imports (the goal: at most 1.5x, export_memory.GOAL).

    python bench/export_calibrated.py                 # the bundled model (resources/tiny)
    python bench/export_calibrated.py --layers 2      # TinyLlama widths, 2 layers (about 0.2 B parameters)
    python bench/export_calibrated.py --against /tmp/base   # each export also by a checkout of other code

With --against (a checkout made with `git worktree add --detach /tmp/base main`), each export is also
written by that checkout's code from the same trained run, just before this tree's, and the ratio of
their write-stage seconds is printed: a before/after measured in one run.
"""

from __future__ import annotations

import argparse
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
FORMATS = ["merged", "gptq-int4", "awq-int4", "w8a8"]


def main() -> int:
    import export_memory

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="folder for the run and the exports (default: a temporary one)")
    parser.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    parser.add_argument("--layers", type=int, help="a TinyLlama-wide random model with this many layers")
    parser.add_argument("--steps", type=int, default=60, help="training steps (the preset's 60 by default)")
    parser.add_argument("--against", type=Path, help="a checkout of other code to write each export too, for a ratio")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="export-calibrated-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    sets = [f"train.max_steps={args.steps}", "train.save_steps=1000", "name=bench-calibrated"]
    if args.layers:
        model = work / "model"
        if not (model / "model.safetensors").is_file():
            export_memory.run_child("--build", str(model), "--layers", str(args.layers), env=env)
        sets += [f"model.path={model}", "train.seq_len=64", "train.micro_batch_size=2"]
    began = time.monotonic()
    train = subprocess.run([sys.executable, "-m", "backend.cli", "train", str(ROOT / "resources/presets/tiny_lora.yaml"),
                            *[a for s in sets for a in ("--set", s)]], cwd=ROOT, env=env, capture_output=True, text=True)
    found = re.search(r"adapter:\s+(\S+)/adapter", train.stdout)
    if train.returncode != 0 or not found:
        raise SystemExit(f"training failed:\n{train.stdout[-2000:]}\n{train.stderr[-2000:]}")
    run_dir = Path(found.group(1))
    print(f"run: {run_dir}, trained in {time.monotonic() - began:.0f} s", flush=True)
    rows = []
    for fmt in args.formats:
        out = work / "exports" / fmt
        there = _write_with(args.against, fmt, run_dir, work / "against" / fmt, env) if args.against else None
        stdout = export_memory.run_child("--one", fmt, str(run_dir), str(out), env=env)
        result = json.loads(stdout.split("RESULT ", 1)[1])
        report_path = out / "export_report.json"
        report = json.loads(report_path.read_text()) if report_path.is_file() else None
        rows.append((fmt, result, report))
        print(f"  {fmt}: {result['wall']:.1f} s {result['error'] or ''}", flush=True)
        if report:
            print("    " + report["loaded_as"] + "\n    " + "; ".join(report["notes"]), flush=True)
        if there is not None and report:
            here = report["timings"]["write"]
            print(f"    write stage: {there:.1f} s by {args.against}, {here:.1f} s here: {there / here:.2f}x faster",
                  flush=True)
    print(export_memory.table(rows))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _write_with(checkout: Path, fmt: str, run_dir: Path, out: Path, env: dict) -> float:
    """The write stage's seconds of `fmt` exported by another checkout's code (its own export_memory child)."""
    done = subprocess.run([sys.executable, str(checkout / "bench" / "export_memory.py"), "--one", fmt, str(run_dir),
                           str(out)], cwd=checkout, env={**env, "PYTHONPATH": str(checkout)}, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{fmt} by {checkout} failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "export_report.json").read_text())["timings"]["write"]


if __name__ == "__main__":
    raise SystemExit(main())
