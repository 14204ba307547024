"""Train page, objectives: DPO and GRPO runs chart their own metrics, GRPO's completions list fills and stays bounded."""

from __future__ import annotations

from backend.core.protocol import CompletionScored, MetricsLogged
from studio.state.objective_store import MAX_COMPLETIONS, ObjectiveStore
from tests.fakes import fake_command


DATA = {"sft": "demo_train", "dpo": "demo_dpo", "grpo": "demo_grpo"}


def _run(qtbot, studio, objective: str) -> None:
    studio.config.set("technique.objective", objective)
    studio.pages["data"].choose(f"bundled:datasets/{DATA[objective]}.jsonl")
    studio.window.show_page("train")
    qtbot.waitUntil(studio.train_page.start_button.isEnabled, timeout=5000)  # the data page's check is in
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: studio.state.status == "finished" and not studio.jobs["train"].is_running(),
                    timeout=15000)


def test_a_grpo_run_charts_rewards_and_lists_the_latest_completions(qtbot, make_studio):
    studio = make_studio(fake_command("objectives", 0.005))
    studio.config.set("grpo.rewards", [{"kind": "exact_match", "column": "answer"},
                                       {"kind": "length", "target": 3, "weight": 0.5}])
    _run(qtbot, studio, "grpo")
    page, store = studio.train_page, studio.store.objective
    assert page.objective_charts.kind() == "grpo" and not page.tabs.tabBar().isHidden()
    assert page.tabs.tabText(1) == "Rewards and completions" and not page.completions_box.isHidden()
    page.show_objective()
    charts = page.objective_charts.grpo
    assert charts["reward"].series_names() == ["reward", "reward_std"] and charts["reward"].point_count("reward") == 10
    assert charts["functions"].series_names() == ["rewards/exact_match/mean", "rewards/exact_match/std",
                                                  "rewards/length/mean", "rewards/length/std"]
    assert charts["kl"].point_count() == 10 and charts["length"].point_count() == 10
    assert charts["clip"].series_names() == ["clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"]
    legend = charts["clip"].legend  # words, not TRL's keys; the keys are in the tooltip
    assert "in&nbsp;region" in legend and "low" in legend and "high" in legend and "_mean" not in legend
    assert "clip_ratio/low_mean" in charts["clip"].parentWidget().toolTip()
    assert store.latest("reward") > store.arrays("reward")[1][0]  # the fake learns
    rows = page.completions.rows()
    assert len(rows) == MAX_COMPLETIONS < 2 * 4 * 10  # two prompts x four generations x ten steps were sent
    assert rows[0].startswith("step 10 · reward") and "exact_match 1" in rows[0] + rows[1]
    assert "The loss goes down." in page.completions.item(0).toolTip()  # the whole prompt, the row shows its end


def test_a_dpo_run_charts_chosen_against_rejected_and_an_sft_run_looks_as_before(qtbot, make_studio):
    studio = make_studio(fake_command("objectives", 0.005))
    _run(qtbot, studio, "dpo")
    page = studio.train_page
    assert page.objective_charts.kind() == "preference" and page.tabs.tabText(1) == "Preference rewards"
    assert not page.completions_box.isVisibleTo(page)
    charts = page.objective_charts.preference
    assert charts["rewards"].point_count("rewards/chosen") == 10 and charts["rewards"].point_count("rewards/rejected")
    assert charts["margin"].point_count() == 10 and charts["accuracy"].point_count() == 10
    assert studio.store.objective.latest("rewards/accuracies") == 1.0
    assert not charts["kl"].isVisibleTo(page.objective_charts)  # DPO logs no KL
    samples = page.samples.samples()  # a DPO run samples answers at each evaluation too
    assert len(samples) == 4 and samples[0].endswith("→  yes") and "Does the model learn?" in samples[1]

    _run(qtbot, studio, "sft")  # a new run: nothing of the DPO run stays
    assert page.objective_charts.kind() == "" and page.tabs.tabBar().isHidden()
    assert page.tabs.currentIndex() == 0 and studio.store.objective.names() == []
    assert page.chart.point_count() == 10


def test_the_store_keeps_extra_metrics_by_name_and_history_for_a_resume(qtbot):
    store = ObjectiveStore()
    store.apply(MetricsLogged(step=1, max_steps=5, extra={"reward": 0.5, "rewards/regex/mean": 0.25}))
    for step in range(MAX_COMPLETIONS + 5):
        store.apply(CompletionScored(step=step, prompt="p", completion="c", reward=1.0))
    assert store.kind() == "grpo" and store.reward_labels() == ["regex"]
    assert len(store.completions) == MAX_COMPLETIONS and store.completions[-1].step == MAX_COMPLETIONS + 4
    store.clear()
    store.load_history([{"type": "MetricsLogged", "step": 2, "extra": {"rewards/margins": 0.3}},
                        {"type": "MetricsLogged", "step": 9, "extra": {"rewards/margins": 0.9}},
                        {"type": "CompletionScored", "step": 2, "prompt": "p", "completion": "c", "reward": 0.0}],
                       up_to_step=5)
    assert store.kind() == "preference" and store.count("rewards/margins") == 1 and len(store.completions) == 1


def test_after_a_grpo_run_in_a_small_window_no_chart_is_squashed_and_no_legend_covers_a_curve(qtbot, make_studio):
    from PySide6.QtWidgets import QApplication

    from studio.pages.train_page import CHART_MIN_HEIGHT

    studio = make_studio(fake_command("objectives", 0.005))
    studio.window.resize(1024, 700)
    studio.config.set("grpo.rewards", [{"kind": "exact_match", "column": "answer"},
                                       {"kind": "length", "target": 3, "weight": 0.5}])
    _run(qtbot, studio, "grpo")
    page = studio.train_page
    page.show_objective()
    functions = page.objective_charts.grpo["functions"]
    for chart in page.charts():
        chart.flush()
    for _ in range(3):  # the legends shown, then the layouts they ask for
        QApplication.processEvents()
    assert functions.getPlotItem().legend is None  # no legend drawn on the plot
    assert "exact_match" in functions.legend and "length" in functions.legend
    assert functions.legend.count("spread") == 1  # the dashed spreads share one entry
    legend_label = functions.parentWidget().layout().itemAt(1).widget()
    assert legend_label.isVisibleTo(page) and not legend_label.geometry().intersects(functions.geometry())
    shown = [c for c in page.charts() if c.isVisibleTo(page)]
    assert page.gpu_panel.memory_chart in shown
    assert all(chart.height() >= CHART_MIN_HEIGHT for chart in shown), [c.height() for c in shown]


def test_a_completions_line_breaks_stay_visible_in_its_row():
    from studio.widgets.completion_list_widget import NEWLINE, completion_text

    event = CompletionScored(step=2, prompt="Yes or no?", completion="tes S\nno", rewards={"regex": 0.0}, reward=0.0)
    assert completion_text(event).endswith(f": tes S {NEWLINE} no")
    spaced = CompletionScored(step=2, prompt="p", completion="a   b\n\n c ", rewards={}, reward=1.0)
    assert completion_text(spaced).endswith(f": a b {NEWLINE}  {NEWLINE} c")


def test_an_empty_sample_list_says_when_samples_come_and_why_a_run_has_none(qtbot):
    from PySide6.QtGui import QColor, QImage

    from studio.widgets.sample_list_widget import EMPTY, SampleListWidget

    samples = SampleListWidget()
    qtbot.addWidget(samples)
    samples.resize(260, 160)
    samples.show()
    image = samples.viewport().grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    background = QColor(image.pixel(image.width() - 2, image.height() - 2))
    drawn = {QColor(image.pixel(x, y)).rgb() for x in range(0, image.width(), 2) for y in range(0, 40, 2)}
    assert len(drawn - {background.rgb()}) > 1  # the wrapped text is drawn at the top
    assert "validation split" in EMPTY and "eval_steps" in EMPTY
