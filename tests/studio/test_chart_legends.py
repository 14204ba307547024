"""Chart legends: every legend is a label under its plot, never drawn over the curves (issue 33)."""

from __future__ import annotations

from PySide6.QtWidgets import QApplication

from studio.widgets.chart_legend import with_legend
from studio.widgets.live_chart import LiveChart
from studio.widgets.run_overlay_chart import RunOverlayChart
from tests.fakes import fake_command


def _legend_label(chart: LiveChart):
    return chart.parentWidget().layout().itemAt(1).widget()


def test_the_loss_legend_sits_under_the_plot_and_no_chart_draws_one_on_its_curves(qtbot, make_studio):
    studio = make_studio(fake_command("objectives", 0.005))
    studio.window.resize(1024, 700)
    studio.config.set("technique.objective", "grpo")
    studio.pages["data"].choose("bundled:datasets/demo_grpo.jsonl")
    studio.window.show_page("train")
    qtbot.waitUntil(studio.train_page.start_button.isEnabled, timeout=5000)
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: studio.state.status == "finished" and not studio.jobs["train"].is_running(), timeout=15000)
    chart = studio.train_page.chart
    chart.flush()
    for _ in range(3):
        QApplication.processEvents()
    assert "train&nbsp;loss" in chart.legend and "eval&nbsp;loss" in chart.legend
    label = _legend_label(chart)
    assert label.isVisibleTo(studio.train_page) and label.text() == chart.legend
    assert label.geometry().top() >= chart.geometry().bottom()  # under the plot: it covers no point
    charts = studio.window.findChildren(LiveChart)
    assert len(charts) > 10 and all(c.getPlotItem().legend is None for c in charts)


def test_the_run_overlay_names_each_run_under_the_plot(qtbot):
    overlay = RunOverlayChart()
    box = with_legend(overlay)
    qtbot.addWidget(box)
    overlay.set_runs([("run-a", [1, 2], [2.0, 1.0]), ("run-b", [1, 2], [2.5, 1.5])])
    assert overlay.getPlotItem().legend is None
    assert "run-a" in overlay.legend and "run-b" in overlay.legend and _legend_label(overlay).text() == overlay.legend
    overlay.set_runs([])
    assert not _legend_label(overlay).isVisibleTo(box)
