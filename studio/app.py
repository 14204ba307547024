"""Composition root: builds the services, state and window, wires them, runs the event loop.

Everything here is cheap to import (no torch, ever): the window must open in well under a second,
and the studio must survive anything the worker's GPU stack does.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication

from backend.config import ConfigError, RunConfig
from backend.paths import resources_dir
from studio.main_window import MainWindow
from studio.run_controller import RunController
from studio.services.worker_client import WorkerClient
from studio.state.form_values import FormValues
from studio.state.metric_store import MetricStore
from studio.state.run_state import RunState

PRESET = "presets/tiny_lora.yaml"
"""The starting point of the form, relative to resources/; RunConfig defaults if it is missing."""

STARTUP_PROBE_ENV = "FINETUNE_STUDIO_STARTUP_PROBE"
"""When set, print `STARTUP_PROBE <unix time>` after the first paint of the window and
`STARTUP_READY <unix time>` after the first paint of the chart, then quit (bench/startup_time.py)."""


def base_config() -> RunConfig:
    """The preset the form starts from (the file the CLI would run), or the defaults."""
    preset = resources_dir() / PRESET
    return RunConfig.load(preset) if preset.is_file() else RunConfig()


def form_from_config(config: RunConfig) -> FormValues:
    return FormValues(config.model.path, config.data.path, config.technique.lora_rank,
                      config.train.max_steps)


def build_config(values: FormValues, base: RunConfig | None = None) -> RunConfig:
    """The form's choices over the preset, validated: raises ConfigError naming the field."""
    raw = (base or base_config()).model_dump(mode="json")
    raw["model"]["path"] = values.model_path
    raw["data"]["path"] = values.data_path
    raw["technique"]["lora_rank"] = values.lora_rank
    raw["train"]["max_steps"] = values.max_steps
    if raw["train"].get("warmup_steps", 0) >= values.max_steps:
        raw["train"]["warmup_steps"] = 0  # the preset's warmup cannot outlast a short run
    return RunConfig.from_dict(raw, source="form")


@dataclass
class Studio:
    """The built application, handed to run_app and to tests."""

    window: MainWindow
    controller: RunController
    client: WorkerClient
    store: MetricStore
    state: RunState


def build_studio(worker_command: Sequence[str] | None = None,
                 worker_env: dict[str, str] | None = None, defer_chart: bool = False) -> Studio:
    """Build and wire everything (a QApplication must exist). Tests pass a fake worker command.

    With `defer_chart` the chart is left for `install_chart`, so the window can paint first.
    """
    store = MetricStore()
    state = RunState()
    client = WorkerClient()
    window = MainWindow()
    if not defer_chart:
        install_chart(window, store)
    try:
        base = base_config()
        problem = ""
    except ConfigError as exc:
        base, problem = RunConfig(), str(exc)
    window.set_form_values(form_from_config(base))
    controller = RunController(window, client, store, state,
                               config_factory=lambda values: build_config(values, base),
                               worker_command=worker_command, worker_env=worker_env, parent=window)
    for child in (store, state, client):
        child.setParent(controller)
    if problem:
        state.note(f"The preset could not be read, using defaults: {problem}")
    return Studio(window, controller, client, store, state)


def install_chart(window: MainWindow, store: MetricStore) -> None:
    """Build the loss chart; pyqtgraph and numpy are imported here, not at startup."""
    from studio.widgets.loss_chart import LossChart

    window.set_chart(LossChart(store))


class _AfterFirstPaint(QObject):
    """Calls `callback` once, when the watched widget's first paint pass has finished."""

    def __init__(self, watched: QObject, callback: Callable[[], None]) -> None:
        super().__init__(watched)
        self._callback = callback
        watched.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.Paint:
            watched.removeEventFilter(self)
            QTimer.singleShot(0, self._callback)  # after the whole paint pass, not at its start
        return False


def _probe(label: str, then_quit: bool = False) -> None:
    print(f"{label} {time.time():.6f}", flush=True)
    if then_quit:
        QApplication.quit()


def run_app(argv: list[str] | None = None) -> int:
    """Open the window and run until it closes; returns the exit code.

    The window paints first and the chart (pyqtgraph, numpy: about a third of a second) is built
    right after, so the person sees the studio as soon as Qt itself can draw.
    """
    app = QApplication.instance() or QApplication([sys.argv[0], *(argv or [])])
    app.setApplicationName("Finetune Studio")
    app.setOrganizationName("finetune-studio")
    studio = build_studio(defer_chart=True)
    app.aboutToQuit.connect(studio.client.shutdown)
    probing = bool(os.environ.get(STARTUP_PROBE_ENV))

    def after_first_paint() -> None:
        if probing:
            _probe("STARTUP_PROBE")
        install_chart(studio.window, studio.store)
        if probing and studio.window.chart is not None:
            _AfterFirstPaint(studio.window.chart.viewport(), lambda: _probe("STARTUP_READY", then_quit=True))

    _AfterFirstPaint(studio.window, after_first_paint)
    if probing:
        QTimer.singleShot(30_000, app.quit)  # a probe that never fires must not hang the bench
    studio.window.show()
    return app.exec()
