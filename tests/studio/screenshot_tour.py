"""Walk the real window through every page and save a screenshot of each (run by test_screenshots.py).

    QT_QPA_PLATFORM=xcb DISPLAY=:99 python tests/studio/screenshot_tour.py OUT_DIR

Uses the scripted fake worker (a compressed run with memory samples and evaluations) and the fake
GPU sampler, so the pictures are the same on every machine. Prints one `SHOT <path>` line per
screenshot and exits 0.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from tests.fakes import fake_command  # noqa: E402
from tests.fakes.fake_nvml import FakeSampler  # noqa: E402

SIZE = (1280, 800)


def wait(app: QApplication, condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise SystemExit("the tour timed out waiting for the studio")
        app.processEvents()
        time.sleep(0.01)


def settle(app: QApplication, seconds: float = 0.4) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    # The fake runs go to a folder of the tour's own, never the person's studio data.
    os.environ.setdefault("FINETUNE_STUDIO_HOME", tempfile.mkdtemp(prefix="studio-tour-"))
    app = QApplication(sys.argv[:1])
    app.setApplicationName("Finetune Studio")
    from studio.app import build_studio

    stream = fake_command("stream", None, "--steps", "1200", "--rate", "200", "--logging-steps", "3",
                          "--eval-every", "200", "--save-every", "400", "--telemetry-hz", "4", "--cuda")
    studio = build_studio(worker_command=stream, sampler=FakeSampler(name="Simulated GPU 24 GB"))
    studio.monitor._timer.setInterval(250)  # a denser telemetry line for a short tour
    studio.controller.ask_stop_on_close = lambda: "discard"
    window = studio.window
    window.resize(*SIZE)
    window.show()
    wait(app, lambda: not studio.pages["data"].is_loading())
    studio.config.set("name", "tiny-lora-r8")
    shots = []

    def shoot(name: str) -> None:
        settle(app)
        for chart in studio.train_page.charts():
            chart.flush()
        settle(app, 0.2)
        path = out / f"{name}.png"
        window.grab().save(str(path))
        screen = window.screen().grabWindow(0, window.x(), window.y(), window.width(), window.height())
        screen.save(str(out / f"{name}-screen.png"))
        shots.append(path)
        print(f"SHOT {path}", flush=True)

    for key in ("model", "data", "techniques"):
        window.show_page(key)
        shoot(key)
    window.show_page("train")
    studio.train_page.start_button.click()
    wait(app, lambda: not studio.client.is_running(), timeout=120)
    shoot("train")
    studio.config.set("name", "tiny-lora-r16")
    studio.config.set("technique.lora_rank", 16)
    studio.config.set("train.learning_rate", 0.001)
    studio.controller.worker_command = fake_command("stream", None, "--steps", "1200", "--rate", "400", "--logging-steps", "3", "--cuda")
    studio.train_page.start_button.click()
    wait(app, lambda: not studio.client.is_running(), timeout=120)
    window.show_page("runs")
    runs = studio.pages["runs"]
    runs.select_runs([s.run_id for s in runs.summaries[:2]])
    shoot("runs")
    export = studio.pages["export"]
    window.show_page("export")
    export.set_format("gguf-q8_0")
    export.export_button.click()
    wait(app, lambda: not export.jobs.is_running())
    export.evaluation.evaluate_button.click()
    wait(app, lambda: not export.evaluation.jobs.is_running())
    shoot("export")
    chat = studio.pages["chat"]
    window.show_page("chat")
    chat.set_model("both")
    chat.max_tokens.setValue(12)
    chat.message_edit.setText("Give me a haiku about gradients.")
    chat.send_button.click()
    wait(app, lambda: not chat.answering)
    shoot("chat")
    chat.unload_button.click()
    wait(app, lambda: not chat.jobs.is_running())
    studio.extras["theme"].apply("dark")
    window.show_page("train")
    shoot("train-dark")
    studio.monitor.stop()
    QTimer.singleShot(0, window.close)
    settle(app, 0.2)
    return 0 if len(shots) == 8 else 1


if __name__ == "__main__":
    sys.exit(main())
