"""The longest row a card can train, checked by capping the worker (optional step of bench/gpu_check.sh).

Asks `finetune-studio estimate PRESET --max-seq-len --json --worst-case` (key "max_seq_len"; every
position a target, as in the rows it then trains on) for each card size, then trains the preset at that length with the worker's CUDA allocator capped to the card
(bench/gpu_hook: set_per_process_memory_fraction, the CUDA context taken off) and says whether the
run stayed within it. Where the installed CLI has no --max-seq-len, or no way to name the card size,
it says so and writes {"skipped": why}: the step is optional. GPU_CHECK_CARD_ARG (e.g. "--card-gib {gib}")
names the card option where the automatic look-up finds none.

    python bench/gpu_maxlen.py --preset resources/presets/llama-3.2-1b_lora_12gb.yaml --model M --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
CARD_OPTION = re.compile(r"(--(?:card|gpu-memory|vram|memory)[\w-]*)")


def card_argument(help_text: str) -> str | None:
    """The estimate's option naming a card size, as a template with {gib}, or None."""
    if os.environ.get("GPU_CHECK_CARD_ARG"):
        return os.environ["GPU_CHECK_CARD_ARG"]
    found = CARD_OPTION.search(help_text)
    return f"{found.group(1)} {{gib}}" if found else None


def capped(hook_log: Path) -> dict:
    """What the worker's hook did about the cap (bench/gpu_hook/sitecustomize.py), {} if nothing."""
    lines = hook_log.read_text().splitlines() if hook_log.is_file() else []
    return next((e for e in map(json.loads, reversed(lines)) if e.get("hook") == "memory_cap"), {})


def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studio", *argv], cwd=ROOT, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cards-gib", default="24,80")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    out = Path(args.out)
    result: dict = {"cards": []}
    help_text = cli("estimate", "--help").stdout
    template = card_argument(help_text)
    if "--max-seq-len" not in help_text:
        result["skipped"] = "finetune-studio estimate has no --max-seq-len here"
    elif template is None:
        result["skipped"] = "finetune-studio estimate names no card size (set GPU_CHECK_CARD_ARG, e.g. '--card-gib {gib}')"
    jobs = []
    for gib in ([] if "skipped" in result else [int(g) for g in args.cards_gib.split(",")]):
        sets = [f"model.path={args.model}", *args.set]
        done = cli("estimate", args.preset, *[a for s in sets for a in ("--set", s)], "--max-seq-len", "--json",
                   "--worst-case", *template.format(gib=gib).split())
        try:
            length = int(json.loads(done.stdout)["max_seq_len"])
        except (ValueError, KeyError, TypeError):
            result["cards"].append({"gib": gib, "error": (done.stderr or done.stdout).strip()[-300:]})
            continue
        from gpu_models import write_rows

        data = out / f"rows_{length}.jsonl"
        write_rows(data, length, 4)
        command = [sys.executable, str(ROOT / "bench/gpu_preset_run.py"), "--preset", args.preset, "--name",
                   f"maxlen_{gib}gib", "--model", args.model, "--data", str(data), "--out", str(out), "--warmup", "1",
                   "--steps", "2", "--profile-steps", "0", "--seq-len", str(length), "--memory-cap", str(gib * 2**30),
                   "--timeout", str(args.timeout), *[a for s in args.set for a in ("--set", s)]]
        jobs.append((gib, length, subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                   text=True)))
    for gib, length, job in jobs:  # the cards run side by side: each process is capped on its own
        _, err = job.communicate()
        run = json.loads((out / f"maxlen_{gib}gib.json").read_text()) if (out / f"maxlen_{gib}gib.json").is_file() else {}
        peak = (run.get("steady") or {}).get("cuda_max_reserved_bytes")
        cap = capped(out / f"maxlen_{gib}gib_hook.log")
        # within: the capped run trained to its end (an allocation past the cap is an out-of-memory error)
        within = None if not cap.get("applied") else bool(run.get("ok")) and (peak or 0) <= gib * 2**30
        result["cards"].append({"gib": gib, "max_seq_len": length, "trained": bool(run.get("ok")),
                                "max_reserved_bytes": peak, "within": within, "cap": cap,
                                "error": None if run.get("ok") else (run.get("train_tail") or err)[-300:]})
    (out / "maxlen.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
