"""Startup time: `python -m studio` to its first drawn window, against a bare PySide6 window.

The studio promises to open in well under a second because it never imports torch. This measures
the promise the way a person sees it: from launching the real entry point to the end of the first
paint of the main window (`STARTUP_PROBE <unix time>`, printed when FINETUNE_STUDIO_STARTUP_PROBE=1
is set: the window with its page list, menus and status bar) and to the first paint of the real
first page, built right after with everything it needs (pydantic configs, pyqtgraph charts, NVML:
`STARTUP_READY`). The baseline is a bare QMainWindow measured the same way, so the ratio shows what
the studio's own imports and widgets cost over Qt itself.
Runs alternate (studio, bare, studio, ...) so that machine load drifts hit both alike.

    python bench/startup_time.py [--runs 7]

Uses the offscreen Qt platform unless a display (DISPLAY / WAYLAND_DISPLAY) is present; never part of
the test run's pass/fail.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BARE = """
import sys, time
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow

class Probe(QObject):
    def eventFilter(self, watched, event):
        if event.type() == QEvent.Type.Paint:
            watched.removeEventFilter(self)
            QTimer.singleShot(0, self.report)
        return False
    def report(self):
        print(f"STARTUP_PROBE {time.time():.6f}", flush=True)
        QApplication.quit()

app = QApplication(sys.argv)
window = QMainWindow()
window.setCentralWidget(QLabel("bare"))
window.resize(1100, 720)
probe = Probe(window)
window.installEventFilter(probe)
window.show()
sys.exit(app.exec())
"""


def measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds from process launch to each probe line (STARTUP_PROBE, and STARTUP_READY if printed)."""
    start = time.time()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    found = {}
    for line in result.stdout.splitlines():
        label, _, stamp = line.partition(" ")
        if label in ("STARTUP_PROBE", "STARTUP_READY"):
            found[label] = float(stamp) - start
    if "STARTUP_PROBE" not in found:
        raise RuntimeError(f"{argv[:3]} printed no probe (rc {result.returncode}): {result.stderr[-800:]}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="measured runs of each (after one warm-up)")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="startup-bench-")
    env = {**os.environ, "FINETUNE_STUDIO_STARTUP_PROBE": "1", "FINETUNE_STUDIO_HOME": home}
    if not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        env["QT_QPA_PLATFORM"] = "offscreen"
    platform = env.get("QT_QPA_PLATFORM", "native display")
    studio = [sys.executable, "-m", "studio"]
    bare = [sys.executable, "-c", BARE]
    measure(studio, env), measure(bare, env)  # warm the page cache and .pyc files
    times: dict[str, list[float]] = {"studio window": [], "studio pages": [], "bare window": []}
    for _ in range(args.runs):
        got = measure(studio, env)
        times["studio window"].append(got["STARTUP_PROBE"])
        times["studio pages"].append(got.get("STARTUP_READY", float("nan")))
        times["bare window"].append(measure(bare, env)["STARTUP_PROBE"])
    print(f"platform: {platform}; {args.runs} alternated runs each; python {sys.version.split()[0]}")
    for name, values in times.items():
        print(f"{name:>13}: median {statistics.median(values):.3f} s  "
              f"(min {min(values):.3f}, max {max(values):.3f})")
    bare_median = statistics.median(times["bare window"])
    for name in ("studio window", "studio pages"):
        median = statistics.median(times[name])
        print(f"  ratio {name} / bare window = {median / bare_median:.2f}x  (+{median - bare_median:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
