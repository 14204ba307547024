"""How long the Runs page takes to show with twelve long runs (docs/benchmarks.md, "opening the Runs page").

    python bench/runs_page_open.py HOME        # builds 12 runs of 1,200 steps in HOME, times the first show
    python bench/runs_page_open.py HOME --reuse  # a new session on the same HOME: the index is already built

Prints the first and the second show of the page in seconds (show() plus one event-loop pass, offscreen).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_runs(count: int = 12, steps: int = 1200) -> None:
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder

    memory = {"allocated_bytes": 1, "reserved_bytes": 2, "peak_bytes": 3, "rss_bytes": 4}
    for index in range(count):
        folder = RunFolder.create(RunConfig.from_dict({"name": f"run-{index}"}))
        with folder.events_path.open("a") as handle:
            handle.write(json.dumps({"type": "JobStarted", "job": "finetune", "run_dir": str(folder.path),
                                     "max_steps": steps}) + "\n")
            for step in range(1, steps + 1):
                handle.write(json.dumps({"type": "MetricsLogged", "step": step, "max_steps": steps, "loss": 2.0 / step,
                                         "learning_rate": 1e-4, "grad_norm": 0.5, "tokens_per_s": 5000.0,
                                         "memory": memory}) + "\n")
            handle.write(json.dumps({"type": "JobFinished", "run_dir": str(folder.path), "steps": steps,
                                     "final_loss": 0.1}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("home")
    parser.add_argument("--reuse", action="store_true", help="time a new session on runs made before")
    args = parser.parse_args()
    os.environ["FINETUNE_STUDIO_HOME"] = args.home
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    if not args.reuse:
        make_runs()
    from studio.pages.runs_page import RunsPage

    page = RunsPage()
    page.resize(1200, 700)
    for label in ("first show", "second show"):
        started = time.perf_counter()
        page.show()
        app.processEvents()
        print(f"{label} {time.perf_counter() - started:.3f} s", flush=True)
        page.hide()
        app.processEvents()


if __name__ == "__main__":
    main()
