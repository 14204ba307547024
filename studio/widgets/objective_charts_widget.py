"""ObjectiveChartsWidget: what a DPO, KTO or GRPO run is learning, beyond its loss.

DPO and KTO: the implicit rewards of the chosen and the rejected answers (they should part), their
margin, the share of pairs whose chosen answer wins (accuracy) and, for KTO, the KL estimate. GRPO:
the mean reward with its spread within a prompt's group, each reward function's mean (solid) and
spread (dashed), the KL to the reference (when grpo.beta > 0), the completions' mean length and the
clipped share of tokens. The x axis of every chart is the step (no label: small charts keep the room
for the curve). Every chart follows the run's ObjectiveStore; `kind()` picks the set.
"""

from __future__ import annotations

from PySide6.QtWidgets import QGridLayout, QStackedWidget, QWidget

from studio.state.objective_store import ObjectiveStore
from studio.widgets.live_chart import LiveChart
from studio.widgets.metric_chart import MetricChart
from studio.widgets.chart_legend import with_legend
from studio.widgets.multi_series_chart import MultiSeriesChart

TIPS = {
    "rewards": "The implicit reward (beta x log-probability ratio to the reference) of the chosen and the rejected "
               "answers: the chosen one should rise above the rejected one.",
    "margin": "Chosen minus rejected reward, averaged over the batch: grows as the model learns the preference.",
    "accuracy": "Share of pairs whose chosen answer gets the higher reward (0.5 is chance, 1 every pair).",
    "kl": "KL divergence of the tuned model from the reference (the base with the adapters off).",
    "reward": "Mean reward of the sampled completions (the weighted sum of the reward functions), and its "
              "spread within each prompt's group: with no spread a group teaches nothing.",
    "functions": "Each reward function's mean (solid) and spread (dashed) over the sampled completions.",
    "length": "Mean length of the sampled completions, in tokens (cut at grpo.max_completion_length).",
    "clip": "Share of tokens whose probability ratio was clipped (large steps held back): "
            "in region (clip_ratio/region_mean) is either side; low (clip_ratio/low_mean): the "
            "ratio fell below 1 - epsilon on a worse-than-average completion; high "
            "(clip_ratio/high_mean): it rose above 1 + epsilon on a better-than-average one.",
}

CLIPPED = {"clip_ratio/region_mean": "in region", "clip_ratio/low_mean": "low", "clip_ratio/high_mean": "high"}
"""TRL's GRPO clip shares in words, short so the legend stays one line under a narrow chart titled "Clipped
share" (the tooltip says each in full; grpo_trainer: low = ratio < 1 - epsilon_low with a negative advantage,
high = ratio > 1 + epsilon_high with a positive one, region = either). Its low_min and high_max are the
extremes over processes, the same as the means on one process: not drawn."""

OPTIONAL = {"kl": "kl", "accuracy": "rewards/accuracies", "length": "completions/mean_length"}
"""Charts shown only once their metric was logged (KL needs grpo.beta > 0; KTO logs no accuracy)."""


class ObjectiveChartsWidget(QStackedWidget):
    """Page 0: nothing (SFT); page 1: the preference charts; page 2: the GRPO charts."""

    def __init__(self, store: ObjectiveStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._grids: list[tuple[QGridLayout, list[LiveChart], int]] = []
        self.addWidget(QWidget())
        chosen = MultiSeriesChart(store, lambda: [("rewards/chosen", "chosen"), ("rewards/rejected", "rejected")],
                                  "Chosen vs rejected", left="reward", bottom="")
        margin = MetricChart(store, "rewards/margins", "Reward margin", color="#10b981", bottom="")
        accuracy = MetricChart(store, "rewards/accuracies", "Accuracy", color="#a855f7", bottom="")
        kl = MetricChart(store, "kl", "KL to reference", color="#ef4444", bottom="")
        self.preference: dict[str, LiveChart] = {"rewards": chosen, "margin": margin, "accuracy": accuracy, "kl": kl}
        self.addWidget(self._grid(self.preference, columns=4))  # one row: each chart gets the full height

        reward = MultiSeriesChart(store, lambda: [("reward", "mean"), ("reward_std", "spread")],
                                  "Mean reward", left="reward", bottom="", dashed=lambda name: name == "reward_std")
        functions = MultiSeriesChart(store, self._function_series, "Each reward", bottom="",
                                     dashed=lambda name: name.endswith("/std"),
                                     group=lambda name: name.rsplit("/", 1)[0])
        grpo_kl = MetricChart(store, "kl", "KL to reference", color="#ef4444", bottom="")
        length = MetricChart(store, "completions/mean_length", "Length (tokens)", color="#06b6d4", bottom="")
        clip = MultiSeriesChart(store, self._clip_series, "Clipped share", bottom="")
        self.grpo: dict[str, LiveChart] = {"reward": reward, "functions": functions, "length": length,
                                           "clip": clip, "kl": grpo_kl}  # KL last: without grpo.beta it is hidden
        self.addWidget(self._grid(self.grpo, columns=3))
        store.changed.connect(self._follow)
        self._follow()

    def _grid(self, charts: dict[str, LiveChart], columns: int) -> QWidget:
        page = QWidget()
        grid = QGridLayout(page)
        self._grids.append((grid, list(charts.values()), columns))
        grid.setContentsMargins(0, 0, 0, 0)
        for index, (key, chart) in enumerate(charts.items()):
            chart.setToolTip(TIPS.get(key, ""))
            shown = with_legend(chart) if isinstance(chart, MultiSeriesChart) else chart
            grid.addWidget(shown, *divmod(index, columns))
        for column in range(columns):
            grid.setColumnStretch(column, 1)
        for row in range((len(charts) + columns - 1) // columns):
            grid.setRowStretch(row, 1)
        return page

    def _function_series(self) -> list[tuple[str, str]]:
        series = []
        for label in self._store.reward_labels():
            series += [(f"rewards/{label}/mean", label), (f"rewards/{label}/std", f"{label} spread")]
        return [(name, label) for name, label in series if self._store.count(name)]

    def _clip_series(self) -> list[tuple[str, str]]:
        return [(name, label) for name, label in CLIPPED.items() if self._store.count(name)]

    def kind(self) -> str:
        """What is shown: "", "preference" or "grpo"."""
        return ("", "preference", "grpo")[self.currentIndex()]

    def charts(self) -> list[LiveChart]:
        return [*self.preference.values(), *self.grpo.values()]

    def _follow(self) -> None:
        kind = self._store.kind()
        self.setCurrentIndex({"preference": 1, "grpo": 2}.get(kind, 0))
        for charts in (self.preference, self.grpo):  # a metric this trainer does not log: no empty chart
            for key, name in OPTIONAL.items():
                if key in charts:
                    charts[key].setVisible(self._store.count(name) > 0)
        for grid, charts, columns in self._grids:  # a column of hidden charts takes no room
            for column in range(columns):
                shown = any(not chart.isHidden() for chart in charts[column::columns])
                grid.setColumnStretch(column, 1 if shown else 0)
