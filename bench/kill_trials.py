"""SIGKILL the worker at random points of a run, N times, with the studio's WorkerClient watching.

    python bench/kill_trials.py --trials 20 --seed 7

Each trial: start a 16-step run (checkpoint every 4), kill at a random event plus a random delay,
then check that the studio reported the crash, the run is marked failed, every complete checkpoint
loads, and a resume finishes the run (or is refused in one sentence when no checkpoint exists).
Prints one line per trial and the totals for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def random_point(rng: random.Random) -> tuple[str, dict]:
    choice = rng.choice(["phase", "metrics", "checkpoint"])
    delay = rng.randint(0, 800)
    if choice == "phase":
        phase = rng.choice(["plan", "load_model", "load_data", "tokenize", "train", "evaluate", "save"])
        return f"{phase}+{delay}ms", {"type": "PhaseChanged", "phase": phase, "delay_ms": delay}
    if choice == "metrics":
        step = rng.randint(1, 16)
        return f"step{step}+{delay}ms", {"type": "MetricsLogged", "step": step, "delay_ms": delay}
    step = rng.choice([4, 8, 12, 16])
    return f"ckpt{step}+{delay}ms", {"type": "CheckpointSaved", "step": step, "delay_ms": delay}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ["FINETUNE_STUDIO_HOME"] = tempfile.mkdtemp(prefix="kill-trials-")
    from tests.reliability.kill_trial import run_trial

    rng = random.Random(args.seed)
    survived = checkpoints = loaded = resumed = 0
    for index in range(args.trials):
        name, after = random_point(rng)
        began = time.monotonic()
        result = run_trial(name, after)
        survived += result.survived
        checkpoints += len(result.checkpoints)
        loaded += result.checkpoints_loaded
        resumed += result.resumed == "finished"
        print(f"{index + 1:2d} {name:22} crash reported={result.crash_reported} status={result.status_after_kill}"
              f" checkpoints={','.join(result.checkpoints) or '-'} loaded={result.checkpoints_loaded}"
              f" resume={result.resumed} survived={result.survived} [{time.monotonic() - began:.0f}s]", flush=True)
    print(f"survived {survived}/{args.trials}; complete checkpoints found {checkpoints}, loaded {loaded};"
          f" resumed to the end {resumed}")
    return 0 if survived == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
