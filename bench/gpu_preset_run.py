"""One preset through the real CLI for bench/gpu_check.sh: its estimate, a training run, what that run measured.

`finetune-studio estimate PRESET --json` and `finetune-studio train PRESET` (as `python -m studio`)
with the same --set overrides: the built model, the long-rows data, one example per optimizer step
(so that 20 steady steps take seconds, not minutes; a step's peak does not depend on accumulation),
warm-up + measured + profiled steps. Writes OUT/NAME.json: the estimate's total against CUDA's max
allocated and max reserved (the run's memory.json), and the steady-state rate and MFU (bench/steady.py).

    python bench/gpu_preset_run.py --preset resources/presets/llama-3.2-1b_lora_12gb.yaml --name lora_1b \
        --model /tmp/gpu-check/1b --data /tmp/gpu-check/long_rows.jsonl --warmup 3 --steps 20 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from steady import studio_steady  # noqa: E402

HOOK = ROOT / "bench/gpu_hook"


def overrides(args: argparse.Namespace) -> list[str]:
    total = args.warmup + args.steps + args.profile_steps
    sets = [f"model.path={args.model}", f"data.path={args.data}", f"train.max_steps={total}",
            f"train.save_steps={total}", "train.gradient_accumulation_steps=1", "train.logging_steps=1",
            "data.validation_split=0", "train.warmup_steps=0"]
    if args.seq_len:
        sets.append(f"train.seq_len={args.seq_len}")
    return sets + list(args.set)


def cli(*argv: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "studio", *argv], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=timeout)


def estimate(preset: str, sets: list[str]) -> dict:
    done = cli("estimate", preset, *[a for s in sets for a in ("--set", s)], "--json")
    if done.returncode:
        raise RuntimeError(f"estimate failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def train(preset: str, sets: list[str], env: dict, timeout: float) -> tuple[Path | None, str]:
    done = cli("train", preset, *[a for s in sets for a in ("--set", s)], env=env, timeout=timeout)
    folder = next((line.split(":", 1)[1].strip() for line in done.stderr.splitlines()
                   if line.startswith("run folder:")), None)
    tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    if done.returncode:
        return None, "\n".join(tail)
    return Path(folder) if folder else None, "\n".join(tail)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="measured steps after the warm-up")
    parser.add_argument("--profile-steps", type=int, default=3, help="steps profiled after the measured ones")
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--memory-cap", type=int, help="cap the worker's CUDA allocator at this many bytes")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    out = Path(args.out)
    sets = overrides(args)
    result: dict = {"name": args.name, "preset": Path(args.preset).name, "overrides": sets}
    t0 = time.monotonic()
    try:
        predicted = estimate(args.preset, sets)
        result["estimate"] = {"total_bytes": predicted["total_bytes"], "device": predicted.get("device"),
                              "parts": predicted.get("breakdown")}
    except (RuntimeError, ValueError, KeyError) as exc:
        result["estimate"] = {"error": str(exc)}
    env = dict(os.environ, GPU_CHECK_HOOK_LOG=str(out / f"{args.name}_hook.log"),
               PYTHONPATH=os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]))
    if args.profile_steps:
        env["GPU_CHECK_PROFILE"] = f"{args.warmup + args.steps}:{args.profile_steps}:{out / f'{args.name}_profile.txt'}"
    if args.memory_cap:
        env["GPU_CHECK_MEMORY_CAP_BYTES"] = str(args.memory_cap)
    try:
        folder, tail = train(args.preset, sets, env, args.timeout)
    except subprocess.TimeoutExpired:
        folder, tail = None, f"timed out after {args.timeout:.0f} s"
    result["train_tail"] = tail
    result["run_dir"] = str(folder) if folder else None
    result["ok"] = folder is not None
    if folder is not None:
        result["steady"] = studio_steady(folder, args.warmup, args.warmup + args.steps)
        predicted_total = result["estimate"].get("total_bytes")
        for kind in ("allocated", "reserved"):
            measured = result["steady"].get(f"cuda_max_{kind}_bytes")
            if predicted_total and measured:
                result[f"measured_{kind}_over_predicted"] = measured / predicted_total
    result["seconds"] = round(time.monotonic() - t0, 1)
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("train_tail", "overrides")}, indent=1))
    if not result["ok"]:
        print(tail, file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
