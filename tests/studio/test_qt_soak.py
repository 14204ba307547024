"""Guards the `PySide6-Essentials<6.12` pin in pyproject.toml.

PySide6 6.12.0 on Python 3.11 aborts with `Fatal Python error: none_dealloc` within seconds of
QTimer callbacks: a refcount bug that frees Py_None. The studio lives on timers (the worker.log
follower, chart updates), so before lifting the pin this test must pass on the new release. It runs
in a subprocess, because the abort kills the interpreter: in-process it would take pytest down
instead of failing one test.
"""

from __future__ import annotations

import os
import subprocess
import sys

TICKS = 8000

SCRIPT = f"""
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QLabel

app = QApplication([])
label = QLabel("0")
label.show()
count = 0

def tick():
    global count
    count += 1
    label.setText(str(count))
    if count >= {TICKS}:
        timer.stop()
        app.quit()

timer = QTimer()
timer.setInterval(1)
timer.timeout.connect(tick)
timer.start()
app.exec()
print("TICKS", count)
"""


def test_fast_qtimer_updating_a_label_does_not_abort():
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stderr[-2000:]}"
    assert f"TICKS {TICKS}" in result.stdout
