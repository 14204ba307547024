"""The real window on a real X server (Xvfb), page by page, at 1024x700 and 1600x1000, light and dark.

Offscreen rendering hides problems a person would see (fonts, the xcb platform plugin, window
sizes), so this test starts Xvfb itself, runs tests/studio/screenshot_tour.py against it with
QT_QPA_PLATFORM=xcb, and checks each PNG is a drawn window of the asked size, not a blank one, and
that the tour's layout checks (tests/studio/layout_checks.py: no horizontal scroll bar, nothing
squeezed or cut, combo boxes as wide as their items, the Model page's facts not drawn over each
other) found nothing. Skipped when the
`Xvfb` binary is missing (`apt-get install -y xvfb`) or Qt's xcb plugin lacks its libraries
(`apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from tests.studio.screenshot_tour import shot_names

ROOT = Path(__file__).resolve().parents[2]
TOUR = Path(__file__).resolve().parent / "screenshot_tour.py"


def _start_xvfb() -> tuple[subprocess.Popen, str]:
    read, write = os.pipe()
    process = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                               pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as handle:
        number = handle.readline().strip()  # Xvfb writes the display number once it accepts clients
    if not number:
        process.kill()
        pytest.fail("Xvfb started but reported no display number")
    return process, f":{number}"


def _distinct_colours(image: QImage, step: int = 7) -> int:
    seen = set()
    for y in range(0, image.height(), step):
        for x in range(0, image.width(), step):
            seen.add(image.pixel(x, y))
            if len(seen) > 64:
                return len(seen)
    return len(seen)


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed (apt-get install -y xvfb)")
def test_every_page_draws_on_a_real_x_server(tmp_path):
    xvfb, display = _start_xvfb()
    try:
        env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": display,
               "FINETUNE_STUDIO_HOME": str(tmp_path / "home")}
        result = subprocess.run([sys.executable, str(TOUR), str(tmp_path / "shots")], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=240)
    finally:
        xvfb.terminate()
        xvfb.wait(timeout=10)
    if "Could not load the Qt platform plugin" in result.stderr:
        pytest.skip("Qt's xcb plugin cannot load (apt-get install -y libxcb-cursor0 libxcb-icccm4 "
                    "libxcb-keysyms1 libxkbcommon-x11-0)")
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM")]
    assert not problems, "\n".join(problems)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for stem in shot_names():
        size = tuple(int(n) for n in stem.split("-")[1].split("x"))
        for name in (f"{stem}.png", f"{stem}-screen.png"):
            image = QImage(str(tmp_path / "shots" / name))
            assert not image.isNull(), f"{name} was not written"
            assert (image.width(), image.height()) == size, f"{name} is {image.width()}x{image.height()}"
            assert _distinct_colours(image) > 16, f"{name} looks blank"
