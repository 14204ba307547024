"""Steady-state comparison for bench/throughput.py --warmup: the studio's worker against the bare Trainer.

Each side's first `warmup` steps are left out (start-up, allocator growth, kernel selection); the
rate is over the steps after them, to the last. Peak memory is torch's max allocated and max
reserved on CUDA (the studio's from its run's memory.json), the figure a card must hold being the
reserved one. Rounds alternate the two sides; a given --studio-run stands for round 1's studio side.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


def gib(value: float | None) -> str:
    return "n/a" if not value else f"{value / 2**30:.2f} GiB"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def steady_compare(preset: Path, common: list[str], params: dict, warmup: int, steps: int, rounds: int,
                   studio_run: str | None, json_out: str | None) -> int:
    from bench.steady import studio_steady
    from bench.throughput import run_baseline, run_studio

    if steps - warmup < 20:
        print(f"note: {steps - warmup} steady steps (20 or more give a steadier figure)")
    params = {**params, "warmup": warmup}
    rows = []
    for round_ in range(rounds):
        t0 = time.monotonic()
        folder = Path(studio_run) if studio_run and round_ == 0 else Path(run_studio(preset, common)["run_dir"])
        studio = studio_steady(folder, warmup, steps)
        base = run_baseline(params)
        rows.append({"studio": studio, "baseline": base, "studio_run": str(folder)})
        print(f"round {round_ + 1}: studio {studio['tokens_per_s']:,.0f} useful tok/s at steady state "
              f"(steps {studio['from_step'] + 1}-{studio['to_step']}), baseline {base['steady_tokens_per_s']:,.0f} "
              f"(steps {base['warmup'] + 1}-{base['steps']}); studio MFU {studio['mfu'] or 0:.1%}  "
              f"[{time.monotonic() - t0:.0f}s]", flush=True)
    studio_tps = statistics.median(r["studio"]["tokens_per_s"] for r in rows)
    base_tps = statistics.median(r["baseline"]["steady_tokens_per_s"] for r in rows)
    peaks = {side: {kind: max((r[side][key] or 0) for r in rows) for kind, key in keys.items()}
             for side, keys in (("studio", {"allocated": "cuda_max_allocated_bytes", "reserved": "cuda_max_reserved_bytes"}),
                                ("baseline", {"allocated": "peak_bytes", "reserved": "peak_reserved_bytes"}))}
    mfu = statistics.median(r["studio"]["mfu"] or 0 for r in rows) or None
    print(f"| side | useful tokens/s (steady) | max allocated | max reserved |\n|---|---:|---:|---:|\n"
          f"| studio | {studio_tps:,.0f} | {gib(peaks['studio']['allocated'])} | {gib(peaks['studio']['reserved'])} |\n"
          f"| bare Trainer | {base_tps:,.0f} | {gib(peaks['baseline']['allocated'])} | "
          f"{gib(peaks['baseline']['reserved'])} |\n"
          f"| studio / bare | {ratio(studio_tps, base_tps)} | "
          f"{ratio(peaks['studio']['allocated'], peaks['baseline']['allocated'])} | "
          f"{ratio(peaks['studio']['reserved'], peaks['baseline']['reserved'])} |")
    if json_out:
        Path(json_out).write_text(json.dumps({
            "method": params["method"], "warmup": warmup, "steps": steps, "studio_tokens_per_s": studio_tps,
            "baseline_tokens_per_s": base_tps, "studio_mfu": mfu, "peaks": peaks,
            "rounds": [{**r, "baseline": {k: v for k, v in r["baseline"].items() if k != "losses"}} for r in rows]},
            indent=1))
    return 0
