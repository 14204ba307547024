"""TrainPage: step 4, start, watch, stop.

Start, Stop and save (a resumable checkpoint), Cancel (no save), Resume (from the newest complete
checkpoint of the selected or last run); progress with an ETA; loss with eval loss, learning rate,
grad norm and tokens/s; below them the GPU panel with memory over time and, after a run, the
predicted peak beside the measured one. A view only: RunController decides what the buttons do.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.state.metric_store import MetricStore
from studio.state.telemetry_store import TelemetryStore
from studio.widgets.completion_list_widget import CompletionListWidget
from studio.widgets.failure_panel_widget import FailurePanelWidget
from studio.widgets.field_editors import FieldEditors
from studio.widgets.gpu_panel_widget import GpuPanelWidget
from studio.widgets.chart_legend import with_legend
from studio.widgets.loss_chart import LossChart
from studio.widgets.metric_chart import MetricChart
from studio.widgets.objective_charts_widget import ObjectiveChartsWidget
from studio.widgets.page_header_widget import PageHeaderWidget
from studio.widgets.sample_list_widget import SampleListWidget
from studio.widgets.units import clock_text
from studio.widgets.vertical_scroll_area import VerticalScrollArea

CHART_MIN_HEIGHT = 150
"""The least height of each Train page chart: title, ticks, axis label and about ninety pixels of plot."""

THROUGHPUT_TIP = (
    "Useful tokens/s: tokens the loss is computed on, per second of training; padding and prompt tokens are "
    "not counted (saving checkpoints and evaluating are not timed).\n"
    "MFU: model FLOPs over this machine's peak for the precision in use (a large matmul, measured once and "
    "cached). Every computed token counts 6 FLOPs per trained weight, 4 per frozen one (no weight gradient), "
    "plus attention; prompts count here, padding does not."
)


def _button_for(action: QAction) -> QPushButton:
    """A push button that triggers `action` and follows its text, tooltip and enabled state."""
    button = QPushButton(action.icon(), action.text())
    button.setToolTip(action.toolTip())
    button.setEnabled(action.isEnabled())
    button.clicked.connect(action.trigger)

    def follow() -> None:
        button.setEnabled(action.isEnabled())
        button.setText(action.text())
        button.setToolTip(action.toolTip())

    action.changed.connect(follow)
    return button


class TrainPage(QWidget):
    """Run controls, progress, the live charts and the GPU panel."""

    start_anyway_requested = Signal()
    """The person pressed "Start anyway" over the estimate's memory verdict."""

    def __init__(self, metrics: MetricStore, telemetry: TelemetryStore, editors: FieldEditors, start: QAction,
                 stop: QAction, cancel: QAction, resume: QAction, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        header = PageHeaderWidget("Train", "Start the run and watch it learn. Stop and save writes a checkpoint "
                                           "you can resume from; Cancel stops without saving.")
        self.start_button = _button_for(start)
        self.stop_button = _button_for(stop)
        self.cancel_button = _button_for(cancel)
        self.resume_button = _button_for(resume)
        buttons = QHBoxLayout()
        for button in (self.start_button, self.stop_button, self.cancel_button, self.resume_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        self.name_edit = editors.editor("name")
        self.name_edit.setMinimumWidth(180)
        buttons.addWidget(QLabel("Run name"))
        buttons.addWidget(self.name_edit)

        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.blocker_label = QLabel()
        self.blocker_label.setWordWrap(True)
        self.blocker_label.setStyleSheet("color: #dc2626;")
        self.blocker_label.setVisible(False)
        self.start_anyway_button = QPushButton("Start anyway")
        self.start_anyway_button.setToolTip("Start although the estimate is over this device's memory; the run "
                                            "folder records that it was started anyway (started_anyway.json)")
        self.start_anyway_button.setVisible(False)
        self.start_anyway_button.clicked.connect(self.start_anyway_requested)
        self.plan_label = QLabel()
        self.plan_label.setWordWrap(True)
        self.plan_label.setStyleSheet("color: palette(placeholder-text);")
        self.plan_label.setVisible(False)
        self.failure_panel = FailurePanelWidget()
        self.progress = QProgressBar()
        self.progress.setFormat("no run yet")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.eta_label = QLabel("")
        self.eta_label.setMinimumWidth(150)
        self.tokens_label = QLabel("— useful tokens/s")
        self.tokens_label.setToolTip(THROUGHPUT_TIP)
        self.tokens_label.setMinimumWidth(110)
        readouts = QHBoxLayout()
        readouts.addWidget(self.progress, 1)
        readouts.addWidget(self.eta_label)
        readouts.addWidget(self.tokens_label)

        self.chart = LossChart(metrics)
        self.lr_chart = MetricChart(metrics, "learning_rate", "Learning rate", color="#10b981")
        self.grad_chart = MetricChart(metrics, "grad_norm", "Gradient norm", color="#ef4444")
        self.speed_chart = MetricChart(metrics, "tokens_per_s", "Useful tokens per second", color="#06b6d4")
        self.speed_chart.setToolTip(THROUGHPUT_TIP)
        charts = QWidget()
        grid = QGridLayout(charts)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(with_legend(self.chart), 0, 0, 2, 1)
        grid.addWidget(self.lr_chart, 0, 1)
        grid.addWidget(self.grad_chart, 1, 1)
        grid.addWidget(self.speed_chart, 0, 2)
        self.samples = SampleListWidget()
        samples_box = QWidget()
        samples_layout = QVBoxLayout(samples_box)
        samples_layout.setContentsMargins(0, 0, 0, 0)
        samples_layout.setSpacing(2)
        samples_layout.addWidget(QLabel("Sample answers"))
        samples_layout.addWidget(self.samples, 1)
        grid.addWidget(samples_box, 1, 2)
        grid.setColumnStretch(0, 3)
        grid.setColumnStretch(1, 2)
        grid.setColumnStretch(2, 2)
        self.objective_charts = ObjectiveChartsWidget(metrics.objective)
        self.completions = CompletionListWidget(metrics.objective)
        self.completions_box = QWidget()
        completions_layout = QVBoxLayout(self.completions_box)
        completions_layout.setContentsMargins(0, 0, 0, 0)
        completions_layout.setSpacing(2)
        completions_layout.addWidget(QLabel("Latest completions and their rewards (hover for the prompt)"))
        completions_layout.addWidget(self.completions, 1)
        objective = QSplitter(Qt.Orientation.Horizontal)
        objective.addWidget(self.objective_charts)
        objective.addWidget(self.completions_box)
        objective.setStretchFactor(0, 3)
        objective.setStretchFactor(1, 2)
        objective.setSizes([620, 380])  # scaled to the width the tab gets
        self.tabs = QTabWidget()  # SFT: one tab and no tab bar, the page as it always was
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(charts, "Loss and speed")
        self.tabs.addTab(objective, "Objective")
        self._objective_metrics = metrics.objective
        metrics.objective.changed.connect(self._show_objective_tab)
        self._show_objective_tab()
        self.gpu_panel = GpuPanelWidget(telemetry)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.tabs)
        split.addWidget(self.gpu_panel)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        split.setSizes([1000, 900])  # scaled to the space the page gets
        self.split = split
        for chart in self.charts():  # below this a chart's ticks and labels run into each other
            chart.setMinimumHeight(CHART_MIN_HEIGHT)
        self._objective_room = False
        """Whether the charts were given more room for an objective's two rows (done once, then the person's)."""

        layout = QVBoxLayout(self)
        layout.addWidget(header)
        layout.addLayout(buttons)
        layout.addWidget(self.status_label)
        blocker_row = QHBoxLayout()
        blocker_row.addWidget(self.blocker_label, 1)
        blocker_row.addWidget(self.start_anyway_button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addLayout(blocker_row)
        layout.addWidget(self.plan_label)
        layout.addWidget(self.failure_panel)
        layout.addLayout(readouts)
        layout.addWidget(VerticalScrollArea(split), 1)  # a small window scrolls the charts, never squashes them

    def charts(self) -> list:
        return [self.chart, self.lr_chart, self.grad_chart, self.speed_chart,
                self.gpu_panel.memory_chart, self.gpu_panel.util_chart, *self.objective_charts.charts()]

    def _show_objective_tab(self) -> None:
        """The Objective tab (and the tab bar) only for a run that logs DPO, KTO or GRPO metrics."""
        kind = self.objective_charts.kind()
        titles = {"preference": "Preference rewards", "grpo": "Rewards and completions"}
        self.tabs.setTabVisible(1, bool(kind))
        self.tabs.setTabText(1, titles.get(kind, "Objective"))
        self.tabs.tabBar().setVisible(bool(kind))
        self.completions_box.setVisible(kind == "grpo")
        if not kind:
            self.tabs.setCurrentIndex(0)
        elif not self._objective_room and hasattr(self, "split"):
            self._objective_room = True
            total = sum(self.split.sizes())
            if total > 0:
                self.split.setSizes([total * 2 // 3, total - total * 2 // 3])

    def show_objective(self) -> None:
        """Bring the objective's charts to the front (the tour and tests; a person clicks the tab)."""
        if self.objective_charts.kind():
            self.tabs.setCurrentIndex(1)

    def clear_run(self) -> None:
        """Forget what the previous run showed: samples, plan, failure, readouts and chart ranges."""
        self.samples.clear()
        self.set_plan("")
        self.set_status("")
        self.failure_panel.clear()
        self.set_progress(0, 0, None)
        self.set_throughput(None)
        for chart in self.charts():
            chart.reset_range()
            chart.mark_dirty()

    # --- readouts -------------------------------------------------------------------------------
    def set_status(self, text: str, details: str = "") -> None:
        """One sentence; `details` (a crash report) shows as its tooltip."""
        self.status_label.setText(text)
        self.status_label.setToolTip(details)

    def set_start_blocker(self, reason: str, anyway: bool = False) -> None:
        """Why Start is disabled, under the status line ("" hides it); `anyway` offers "Start anyway"
        (only the estimate over memory is in the way, and a person may know better)."""
        self.blocker_label.setText(f"Cannot start: {reason}" if reason else "")
        self.blocker_label.setVisible(bool(reason))
        self.start_anyway_button.setVisible(bool(reason) and anyway)

    def set_plan(self, text: str) -> None:
        """The worker's resolved techniques (PhaseChanged "plan")."""
        self.plan_label.setText(f"Plan: {text}" if text else "")
        self.plan_label.setVisible(bool(text))

    def set_progress(self, step: int, max_steps: int, eta_s: float | None, running: bool = False) -> None:
        """Step of max_steps; before a run (max_steps 0) the bar is empty and says so, not "step 0 / 1"; a
        run counted in epochs learns its steps once the worker has read the data."""
        waiting = "counting the steps…" if running else "no run yet"
        self.progress.setFormat("step %v / %m" if max_steps > 0 else waiting)
        self.progress.setRange(0, max(max_steps, 1))
        self.progress.setValue(min(step, max(max_steps, 1)))
        self.eta_label.setText(f"about {clock_text(eta_s)} left" if eta_s is not None else "")

    def set_throughput(self, tokens_per_s: float | None, mfu: float | None = None,
                       compile_seconds: float | None = None, images_seen: tuple[int, int] | None = None) -> None:
        """Useful tokens/s with MFU beside it; torch.compile's first-step time apart, never averaged in; a
        vision-language run's image rows and image tokens trained on so far."""
        if tokens_per_s is None:
            self.tokens_label.setText("— useful tokens/s")
            return
        parts = [f"{tokens_per_s:,.0f} useful tokens/s"]
        if mfu is not None:
            parts.append(f"MFU {100 * mfu:.1f}%")
        if compile_seconds is not None:
            parts.append(f"compile {compile_seconds:.1f} s (not counted)")
        if images_seen is not None:
            parts.append(f"{images_seen[0]:,} image rows, {images_seen[1]:,} image tokens")
        self.tokens_label.setText(" · ".join(parts))
