"""Composition root: builds the services, state, pages and window, wires them, runs the event loop.

Startup is staged so the window appears as soon as Qt can draw it: `run_app` shows the bare window
(page list, placeholders, status bar: Qt only); right after its first paint `build_core` builds the
config and the Model page (pydantic, no charts), and once that page has painted `build_rest` builds
everything else (pyqtgraph charts, the other pages, NVML). Tests call `build_studio`, which does
both at once. Nothing here ever imports torch: the studio must survive anything the worker's GPU
stack does.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget

from studio.main_window import MainWindow
from studio.services.settings import Settings

if TYPE_CHECKING:  # the heavier modules load after the first paint (see run_app)
    from studio.job_controller import JobController
    from studio.run_controller import RunController
    from studio.services.gpu_monitor import GpuMonitor
    from studio.services.worker_client import WorkerClient
    from studio.state.config_state import ConfigState
    from studio.state.estimate_state import EstimateState
    from studio.state.metric_store import MetricStore
    from studio.state.run_state import RunState
    from studio.state.telemetry_store import TelemetryStore
    from studio.widgets.field_editors import FieldEditors

PRESET = "presets/tiny_lora.yaml"
"""The starting point of the form, relative to resources/; RunConfig defaults if it is missing."""

STARTUP_PROBE_ENV = "FINETUNE_STUDIO_STARTUP_PROBE"
"""When set, print `STARTUP_PROBE <unix time>` after the first paint of the window and
`STARTUP_READY <unix time>` after the first paint of the page the window opens on, then quit once
every page is built (bench/startup_time.py)."""


@dataclass
class Studio:
    """The built application, handed to run_app and to tests."""

    window: MainWindow
    controller: RunController
    client: WorkerClient
    """The training job's worker client (the other pages' jobs are in `jobs`)."""
    store: MetricStore
    state: RunState
    config: ConfigState
    """The draft config the pages edit."""
    estimate: EstimateState
    telemetry: TelemetryStore
    monitor: GpuMonitor
    settings: Settings
    editors: FieldEditors
    pages: dict[str, QWidget] = field(default_factory=dict)
    jobs: dict[str, JobController] = field(default_factory=dict)
    """One JobController per page that runs jobs: train, export, evaluate, chat, prune."""
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def train_page(self) -> Any:
        return self.pages["train"]


def base_config() -> tuple[dict[str, Any], Path | None, str]:
    """(raw config, the file it came from, a problem sentence) for the form's starting point."""
    from backend.core.config.run_config import ConfigError, RunConfig
    from backend.core.paths import resources_dir

    preset = resources_dir() / PRESET
    if not preset.is_file():
        return RunConfig().model_dump(mode="json"), None, ""
    try:
        return RunConfig.load(preset).model_dump(mode="json"), preset, ""
    except ConfigError as exc:
        return RunConfig().model_dump(mode="json"), None, str(exc)


def _remembered(path: str) -> bool:
    """A remembered model or dataset is used again only if it still exists."""
    from backend.core.paths import resolve_resource

    return bool(path) and resolve_resource(path).exists()


@dataclass
class _Core:
    """What the first page needs: built before anything else, so it can paint first."""

    window: MainWindow
    settings: Settings
    config: Any
    editors: Any
    estimate: Any
    problem: str
    pages: dict[str, QWidget] = field(default_factory=dict)


def build_core(window: MainWindow | None = None, settings: Settings | None = None) -> _Core:
    """The draft config, its editors and estimate, and the Model page (pydantic, no pyqtgraph)."""
    from studio.pages.model_page import ModelPage
    from studio.state.config_state import ConfigState
    from studio.state.estimate_state import EstimateState
    from studio.widgets.field_editors import FieldEditors

    settings = settings or Settings()
    window = window or MainWindow()
    raw, source, problem = base_config()
    config = ConfigState(raw, source, parent=window)
    for key, remembered in (("model", settings.last_model), ("data", settings.last_dataset)):
        if _remembered(remembered):  # a change on top of the preset, so the command line names it
            config.set(f"{key}.path", remembered)
    config.mark_clean()  # the restored model and data are not edits to ask about before starting over
    editors = FieldEditors(config, parent=window)
    estimate = EstimateState(config, parent=window)
    core = _Core(window, settings, config, editors, estimate, problem)
    core.pages["model"] = ModelPage(config, editors)
    window.install_page("model", core.pages["model"])
    return core


def build_rest(core: _Core, worker_command: Sequence[str] | None = None, worker_env: dict[str, str] | None = None,
               sampler: Callable[..., Any] | None = None, theme: Any = None,
               synchronous_data: bool = False) -> Studio:
    """Every other page (pyqtgraph, numpy), the worker client, the GPU monitor, and the wiring."""
    from studio.pages.chat_page import ChatPage, memory_warning
    from studio.pages.data_page import DataPage
    from studio.pages.export_page import ExportPage
    from studio.pages.runs_page import RunsPage
    from studio.pages.techniques_page import TechniquesPage
    from studio.pages.train_page import TrainPage
    from studio.job_controller import JobController
    from studio.recovery_controller import RecoveryController
    from studio.run_controller import RunController
    from studio.services.gpu_monitor import GpuMonitor
    from studio.services.theme import Theme
    from studio.services.worker_client import WorkerClient
    from studio.state.metric_store import MetricStore
    from studio.state.run_state import RunState
    from studio.state.telemetry_store import TelemetryStore
    from studio.telemetry_controller import TelemetryController

    window, config, editors, estimate = core.window, core.config, core.editors, core.estimate
    store, telemetry, state = MetricStore(), TelemetryStore(), RunState()

    def jobs() -> JobController:
        return JobController(WorkerClient(), worker_command, worker_env, parent=window)

    training, exporting, evaluating, chatting = jobs(), jobs(), jobs(), jobs()
    client = training.client
    monitor = GpuMonitor(sampler)
    pages = core.pages
    pages["data"] = DataPage(config, editors, synchronous=synchronous_data)
    def measured(profile: Any) -> None:
        estimate.set_longest_answer(profile.path, profile.longest_answer(), profile.most_images())
        hint = f" ({profile.hint})" if profile.hint else ""
        estimate.set_data_problem(profile.path, f"{profile.problem}{hint}" if profile.problem else "")

    pages["data"].profile_ready.connect(measured)
    if pages["data"].profile is not None:  # read while the page was built (synchronously, in tests)
        measured(pages["data"].profile)
    pages["techniques"] = TechniquesPage(config, editors, estimate)

    def counted(profile: Any) -> None:  # the length row's steps <-> epochs
        pages["techniques"].set_examples(None if profile.problem else profile.count)

    def columns_read(_profile: Any) -> None:  # the rewards that read a column the data lacks turn red
        records = pages["data"].records
        known = records is not None and records.objective == "grpo" and bool(records.columns)
        pages["techniques"].rewards.set_columns(records.columns if known else None)

    for slot in (counted, columns_read):
        pages["data"].profile_ready.connect(slot)
        if pages["data"].profile is not None:
            slot(pages["data"].profile)
    pages["train"] = TrainPage(store, telemetry, editors, window.start_action, window.stop_action,
                               window.cancel_action, window.resume_action)
    pages["runs"] = RunsPage()
    runs_page = pages["runs"]

    def selected_run() -> str:
        return next((s.path for s in runs_page.selected()), "")

    def training_warning() -> str:
        if not training.is_running() or training.folder is None:
            return ""
        try:
            running = training.folder.load_config()
        except ValueError:
            running = None
        return memory_warning(running, *estimate.machine,  # the run trains here, whatever card is picked
                              pages["train"].gpu_panel.memory_chart.predicted_peak)

    pages["export"] = ExportPage(exporting, evaluating, preferred_run=selected_run)
    pages["chat"] = ChatPage(chatting, training_warning=training_warning, preferred_run=selected_run)
    for key in ("data", "techniques", "train", "runs", "export", "chat"):
        window.install_page(key, pages[key])
    for key in ("export", "chat"):  # a page in view follows a run that just ended (hidden ones do when shown)
        training.ended.connect(lambda _outcome, page=pages[key]: page.isVisible() and page.refresh_runs())
    controller = RunController(window, pages["train"], runs_page, training, store, telemetry, state, estimate,
                               config_factory=config.config, parent=window)
    recovery = RecoveryController(controller, config, parent=window)
    window.open_config_requested.connect(lambda path: open_config(window, config, path))
    config.started_over.connect(controller.forget_run)
    _wire_start_blocker(window, pages["train"], training, estimate, controller)
    monitor.sampled.connect(lambda sample: pages["techniques"].hardware.set_gpu_count(len(sample.devices)))
    pages["model"].model_chosen.connect(lambda _path: estimate.recompute())  # its folder's files may have changed

    def size_presets(sample: Any) -> None:  # the first GPU seen sets the preset list's card filter, once
        if sample.devices:
            pages["model"].presets.set_card_memory(sample.devices[0].total_bytes)
            monitor.sampled.disconnect(size_presets)

    monitor.sampled.connect(size_presets)
    router = TelemetryController(window, monitor, client, telemetry, estimate, pages["train"].gpu_panel,
                                 parent=window)
    for child in (store, telemetry, state, monitor):
        child.setParent(controller)
    job_controllers = {"train": training, "export": exporting, "evaluate": evaluating, "chat": chatting,
                       "prune": pages["export"].prune.jobs}
    window.save_config_requested.connect(pages["techniques"].command_line.save_button.click)
    if core.problem:
        state.note(f"The preset could not be read, using defaults: {core.problem}")

    theme = theme or Theme(QApplication.instance())
    _wire_settings(window, config, core.settings, theme, controller)
    studio = Studio(window, controller, client, store, state, config, estimate, telemetry, monitor, core.settings,
                    editors, pages, job_controllers,
                    {"telemetry_controller": router, "theme": theme, "recovery": recovery})
    estimate.recompute()
    monitor.start()
    controller.show_peaks()
    return studio


def build_studio(worker_command: Sequence[str] | None = None, worker_env: dict[str, str] | None = None,
                 sampler: Callable[..., Any] | None = None, window: MainWindow | None = None,
                 settings: Settings | None = None, theme: Any = None, synchronous_data: bool = False) -> Studio:
    """Build and wire everything at once (a QApplication must exist). Tests pass a fake worker and sampler."""
    core = build_core(window, settings)
    return build_rest(core, worker_command, worker_env, sampler, theme, synchronous_data)


def _wire_start_blocker(window: MainWindow, train_page: Any, jobs: JobController, estimate: EstimateState,
                        controller: RunController) -> None:
    """Start follows the estimate's verdicts (disabled, with the reason, where the worker would refuse);
    a worker's probed capabilities and each finished run's memory.json feed the estimate back."""
    from backend.core.protocol import WorkerReady

    def show() -> None:
        reason = estimate.start_blocker()
        window.set_start_blocker(reason)
        running = jobs.is_running()
        train_page.set_start_blocker("" if running else reason, anyway=estimate.may_start_anyway())
        controller.show_readiness()

    def on_event(event: Any) -> None:
        if isinstance(event, WorkerReady):
            estimate.set_capabilities(event.capabilities)

    def on_running_changed(running: bool) -> None:
        if not running:
            estimate.recalibrate()  # the run's memory.json is one more measured baseline
        show()

    estimate.changed.connect(show)
    estimate.changed.connect(controller.follow_estimate)
    jobs.event_received.connect(on_event)
    jobs.running_changed.connect(on_running_changed)
    show()


def open_config(window: MainWindow, config: Any, path: str) -> bool:
    """File > Open config: the draft starts over from a RunConfig YAML; a file that does not load is
    one line naming the file, line and field (the draft stays as it was)."""
    from backend.core.config.run_config import ConfigError, RunConfig
    from studio.widgets.discard_question import discard_edits

    try:
        raw = RunConfig.load(path).model_dump(mode="json")
    except ConfigError as exc:
        window.show_problem(f"Cannot open the config: {exc}")
        return False
    if not discard_edits(window, config, Path(path).name):
        return False
    config.replace(raw, source=Path(path))
    window.statusBar().showMessage(f"Opened {path}", 8000)
    return True


def _wire_settings(window: MainWindow, config: Any, settings: Settings, theme: Any, controller: Any) -> None:
    """Remember the model, dataset, theme, page and window layout; restore the page and theme now."""
    def on_config_changed(key: str) -> None:
        if key == "model.path":
            settings.last_model = config.get("model.path")
        elif key == "data.path":
            settings.last_dataset = config.get("data.path")

    def on_theme_requested(name: str) -> None:
        settings.theme = name
        theme.apply(name)

    config.changed.connect(on_config_changed)
    window.theme_requested.connect(on_theme_requested)
    theme.apply(settings.theme)
    window.set_theme_checked(settings.theme)
    window.page_list.currentRowChanged.connect(lambda row: setattr(settings, "page", row))
    if 0 <= settings.page < window.stack.count():
        window.page_list.setCurrentRow(settings.page)
    def remember_layout() -> None:
        settings.save_window(window)
        settings.sync()

    window.add_close_hook(remember_layout)


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

    The bare window paints first; the pages (pydantic, pyqtgraph, numpy: a few tenths of a second)
    are built right after, so the person sees the studio as soon as Qt itself can draw.
    """
    app = QApplication.instance() or QApplication([sys.argv[0], *(argv or [])])
    app.setApplicationName("Finetune Studio")
    app.setOrganizationName("finetune-studio")
    app.setDesktopFileName("io.github.finetune_studio.FinetuneStudio")  # packaging/linux: Wayland app id
    from studio.services.theme import Theme

    settings = Settings()
    theme = Theme(app)
    theme.apply(settings.theme)  # before the first paint: a dark desktop never flashes light
    window = MainWindow()
    app.setWindowIcon(window.windowIcon())
    settings.restore_window(window)
    window.fit_to_screen()
    probing = bool(os.environ.get(STARTUP_PROBE_ENV))
    built: list[Studio] = []

    def after_first_paint() -> None:
        if probing:
            _probe("STARTUP_PROBE")
        core = build_core(window, settings)  # the Model page: paints before the heavier pages exist
        page = settings.page if 0 <= settings.page < window.stack.count() else 0

        def build_the_rest() -> None:
            studio = build_rest(core, theme=theme)
            built.append(studio)
            for jobs in studio.jobs.values():
                app.aboutToQuit.connect(jobs.shutdown)
            app.aboutToQuit.connect(studio.monitor.stop)
            if probing and page != 0:
                _AfterFirstPaint(window.stack.currentWidget(), lambda: _probe("STARTUP_READY", then_quit=True))

        if page == 0:
            def model_page_painted() -> None:
                if probing:
                    _probe("STARTUP_READY")
                build_the_rest()
                if probing:
                    QTimer.singleShot(0, app.quit)

            _AfterFirstPaint(core.pages["model"], model_page_painted)
        else:
            build_the_rest()

    _AfterFirstPaint(window, after_first_paint)
    if probing:
        QTimer.singleShot(30_000, app.quit)  # a probe that never fires must not hang the bench
    window.show()
    return app.exec()
