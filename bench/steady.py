"""Steady-state figures of a finished studio run, read from its folder (events.jsonl, memory.json).

Warm-up steps (CUDA and cuBLAS start-up, allocator growth, the first batches' caches) are left out:
the rate is the useful tokens trained between the end of step `warmup` and the end of step `last`,
over the wall time between those two MetricsLogged events. MFU at steady state is the run's own MFU
per useful token (the worker's figure over its own average rate: rows of one length cost the same
FLOPs per token) times the steady rate.
"""

from __future__ import annotations

import json
from pathlib import Path


def metrics(run_dir: Path) -> list[dict]:
    events = [json.loads(line) for line in (Path(run_dir) / "events.jsonl").read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("type") == "MetricsLogged"]


def window(points: list[tuple[int, float, float]], warmup: int, last: int) -> dict:
    """(step, tokens so far, seconds so far) points -> the rate from the first point at or after
    `warmup` to the last at or before `last`."""
    begin = next((p for p in points if p[0] >= warmup), None)
    end = next((p for p in reversed(points) if p[0] <= last), None)
    if begin is None or end is None or end[0] <= begin[0] or end[2] <= begin[2]:
        raise ValueError(f"no steady window between steps {warmup} and {last} in {len(points)} points")
    return {"from_step": begin[0], "to_step": end[0], "steps": end[0] - begin[0], "tokens": end[1] - begin[1],
            "seconds": end[2] - begin[2], "tokens_per_s": (end[1] - begin[1]) / (end[2] - begin[2])}


def studio_steady(run_dir: Path, warmup: int, last: int) -> dict:
    """Steady rate, MFU and the measured peaks of one studio run."""
    logged = metrics(run_dir)
    result = window([(e["step"], e["tokens_seen"], e["elapsed_s"]) for e in logged], warmup, last)
    finished = [json.loads(line) for line in (Path(run_dir) / "events.jsonl").read_text().splitlines()
                if '"JobFinished"' in line]
    average = finished[-1].get("tokens_per_s") if finished else None
    mfu = (finished[-1].get("mfu") if finished else None) or next((e.get("mfu") for e in reversed(logged)
                                                                    if e.get("mfu")), None)
    result["mfu"] = mfu * result["tokens_per_s"] / average if mfu and average else None
    result["run_mfu"] = mfu
    memory = Path(run_dir) / "memory.json"
    record = json.loads(memory.read_text()) if memory.is_file() else {}
    result.update({k: record.get(k) for k in ("predicted_total_bytes", "cuda_max_allocated_bytes",
                                              "cuda_max_reserved_bytes", "peak_rss_bytes", "device")})
    return result
