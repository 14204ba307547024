"""Walk the real window through every page at two sizes in both themes, screenshot and check each.

    QT_QPA_PLATFORM=xcb DISPLAY=:99 python tests/studio/screenshot_tour.py OUT_DIR

Uses the scripted fake worker (a compressed run with memory samples and evaluations) and the fake
GPU sampler, so the pictures are the same on every machine. First it fills the studio (two runs, an
export, an evaluation, a chat), then for each theme and size it shows every page, saves
`PAGE-WxH-THEME.png` (the window's own drawing) and `PAGE-WxH-THEME-screen.png` (what the X server
shows), and runs tests/studio/layout_checks.py on it. One window is reused: resizing and switching
the theme cost far less than building the studio again. Prints one `SHOT <path>` line per
screenshot and one `PROBLEM <text>` line per layout fault; exits 0 only if every shot was taken
and no fault was found.
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
from tests.studio import layout_checks  # noqa: E402

SIZES = ((1024, 700), (1600, 1000))
"""The smallest window the studio must be usable in, and a common desktop one."""
THEMES = ("light", "dark")
PAGES = ("model", "data", "techniques", "train", "runs", "export", "chat")
OBJECTIVE_SHOTS = (("techniques_grpo", "techniques"), ("data_grpo", "data"), ("train_grpo", "train"),
                   ("runs_compare", "runs"))
"""(shot, page) after a GRPO run from the tiny_grpo preset: the objective's settings, data, charts, comparison."""


def shot_names() -> list[str]:
    """Every screenshot's file name stem, in the order the tour takes them."""
    return ([f"{page}-{w}x{h}-{theme}" for theme in THEMES for w, h in SIZES for page in PAGES]
            + [f"{shot}-{w}x{h}-{theme}" for theme in THEMES for w, h in SIZES for shot, _ in OBJECTIVE_SHOTS])


def wait(app: QApplication, condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise SystemExit("the tour timed out waiting for the studio")
        app.processEvents()
        time.sleep(0.01)


def settle(app: QApplication, seconds: float = 0.3) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def fill(app: QApplication, studio) -> None:
    """Two finished runs, an export with its report, an evaluation and a chat: every page has content."""
    window = studio.window
    window.show_page("train")
    studio.train_page.start_button.click()
    wait(app, lambda: not studio.jobs["train"].is_running(), timeout=120)
    studio.config.set("name", "tiny-lora-r16")
    studio.config.set("technique.lora_rank", 16)
    studio.config.set("train.learning_rate", 0.001)
    studio.jobs["train"].worker_command = fake_command("stream", None, "--steps", "1200", "--rate", "400",
                                                    "--logging-steps", "3", "--cuda")
    studio.train_page.start_button.click()
    wait(app, lambda: not studio.jobs["train"].is_running(), timeout=120)
    window.show_page("runs")
    runs = studio.pages["runs"]
    runs.select_runs([s.run_id for s in runs.summaries[:2]])
    export = studio.pages["export"]
    window.show_page("export")
    export.set_format("gguf-q8_0")
    export.export_button.click()
    wait(app, lambda: not export.jobs.is_running())
    export.evaluation.evaluate_button.click()
    wait(app, lambda: not export.evaluation.jobs.is_running())
    chat = studio.pages["chat"]
    window.show_page("chat")
    chat.set_model("both")
    chat.max_tokens.setValue(12)
    chat.message_edit.setText("Give me a haiku about gradients.")
    chat.send_button.click()
    wait(app, lambda: not chat.answering)  # the session stays loaded: the answer is the end


def fill_grpo(app: QApplication, studio) -> None:
    """The tiny_grpo preset with a second reward, trained by the fake worker's objectives scenario."""
    from backend.core.paths import resources_dir

    studio.pages["model"].use_preset(resources_dir() / "presets" / "tiny_grpo.yaml")
    studio.config.set("grpo.rewards", [{"kind": "exact_match", "column": "answer", "weight": 1.0},
                                       {"kind": "regex", "pattern": "^(yes|no)$", "weight": 0.5}])
    studio.jobs["train"].worker_command = fake_command("objectives", 0.05, "--cuda")
    studio.window.show_page("train")
    wait(app, lambda: studio.train_page.start_button.isEnabled())
    studio.train_page.start_button.click()
    wait(app, lambda: not studio.jobs["train"].is_running(), timeout=120)
    studio.train_page.show_objective()
    runs = studio.pages["runs"]
    studio.window.show_page("runs")
    runs.select_runs([s.run_id for s in runs.summaries[:2]])
    runs.set_metric("reward")


def problems_of(studio, key: str) -> list[str]:
    """The layout faults of the page now shown."""
    page = studio.pages[key]
    found = layout_checks.page_problems(page)
    if key == "model":
        form = page.facts["architecture"].parentWidget().layout()
        found += layout_checks.overlapping_rows(form)
    return found


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
    window.resize(*SIZES[0])
    window.show()
    wait(app, lambda: not studio.pages["data"].is_loading())
    studio.config.set("name", "tiny-lora-r8")
    fill(app, studio)
    studio.monitor.stop()  # the pictures hold still from here on
    shots, faults = [], 0

    def shoot(key: str, name: str) -> None:
        nonlocal faults
        window.show_page(key)
        settle(app)
        for chart in studio.train_page.charts():
            chart.flush()
        settle(app, 0.1)
        for problem in problems_of(studio, key):
            faults += 1
            print(f"PROBLEM {name}: {problem}", flush=True)
        path = out / f"{name}.png"
        window.grab().save(str(path))
        screen = window.screen().grabWindow(0, window.x(), window.y(), window.width(), window.height())
        screen.save(str(out / f"{name}-screen.png"))
        shots.append(path)
        print(f"SHOT {path}", flush=True)

    for theme in THEMES:
        studio.extras["theme"].apply(theme)
        for width, height in SIZES:
            window.resize(width, height)
            for key in PAGES:
                shoot(key, f"{key}-{width}x{height}-{theme}")
    fill_grpo(app, studio)
    for theme in THEMES:
        studio.extras["theme"].apply(theme)
        for width, height in SIZES:
            window.resize(width, height)
            for shot, key in OBJECTIVE_SHOTS:
                shoot(key, f"{shot}-{width}x{height}-{theme}")
    for jobs in studio.jobs.values():
        jobs.shutdown()  # the chat session keeps its worker until the studio quits
    QTimer.singleShot(0, window.close)
    settle(app, 0.2)
    return 0 if len(shots) == len(shot_names()) and not faults else 1


if __name__ == "__main__":
    sys.exit(main())
