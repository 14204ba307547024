"""Data, Model and Runs pages, objectives: data previews per objective, the start adapter, comparing runs' metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from backend.core.data.objective_records import read_objective_records
from studio.state.run_metrics import RunMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_the_data_page_previews_each_objectives_records_and_refuses_in_one_line(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    studio.config.set("technique.objective", "dpo")
    assert "line 1: a preference pair needs the fields" in page.summary_label.text()  # the SFT demo set is no pair data
    assert page.objective_preview.rowCount() == 0 and not page.lengths_box.isVisibleTo(page)
    qtbot.waitUntil(lambda: "a preference pair needs" in studio.estimate.start_blocker(), timeout=3000)
    page.choose("bundled:datasets/demo_dpo.jsonl")
    assert "preference pairs for dpo" in page.summary_label.text() and "600 records" in page.summary_label.text()
    preview = page.objective_preview
    assert [preview.horizontalHeaderItem(c).text() for c in range(3)] == ["Prompt", "Chosen ✓", "Rejected ✗"]
    # through the bundled model's chat template: the prompt up to the assistant's turn, each answer as trained
    # on; the cells without the special tokens, the tooltip as the model reads it
    assert preview.cell_text(0, "chosen") == "no" and preview.cell_text(0, "rejected") == "yes"
    assert preview.cell_text(0, "prompt").startswith("Is this a question?") and "<|" not in preview.cell_text(0, "prompt")
    names = [preview.horizontalHeaderItem(c).text() for c in range(3)]
    tip = preview.item(0, names.index("Prompt")).toolTip()
    assert tip.startswith("As the model reads it:\n<|bos|><|user|>\n") and tip.endswith("<|assistant|>\n")
    assert "shown through the chat template" in page.summary_label.text()
    assert page.split_label.text() == "570 train · 30 validation"
    qtbot.waitUntil(lambda: studio.estimate.start_blocker() == "", timeout=3000)

    kto = tmp_path / "kto.jsonl"
    kto.write_text("\n".join(json.dumps(r) for r in (
        {"prompt": "2+2?", "completion": "4", "label": True},
        {"prompt": "2+2?", "completion": "5", "label": False},
        {"prompt": "3+3?", "completion": "6"})) + "\n", encoding="utf-8")
    studio.config.set("technique.objective", "kto")
    page.choose(str(kto))
    text = page.summary_label.text()
    assert "line 3" in text and "'label'" in text and "<br>" not in text  # one line: where, what is missing, the fix

    studio.config.set("technique.objective", "grpo")
    page.choose("bundled:datasets/demo_grpo.jsonl")
    assert "prompts for grpo" in page.summary_label.text() and page.objective_preview.cell_text(0, "answer") == "no"
    studio.config.set("grpo.rewards", [{"kind": "exact_match", "column": "gold"}])  # a column the data lacks
    assert "no 'gold'" in page.summary_label.text()
    studio.config.set("technique.objective", "sft")
    page.choose("bundled:datasets/demo_train.jsonl")
    assert page.previews.currentWidget() is page.preview and page.lengths_box.isVisibleTo(page)


def test_the_objective_reader_stays_torch_free_and_reads_json_conversations(tmp_path):
    data = tmp_path / "pairs.json"
    data.write_text(json.dumps([{"prompt": [{"role": "user", "content": "hi"}], "chosen": "hello",
                                 "rejected": "go away"}]), encoding="utf-8")
    records = read_objective_records(str(data), "dpo")
    assert records.problem == "" and records.rows[0]["prompt"] == "user: hi" and records.count == 1
    probe = ("import sys, backend.core.data.objective_records, studio.widgets.adapter_picker_widget, "
             "studio.state.run_metrics; print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


def _adapter_run(name: str, rank: int = 8) -> RunFolder:
    folder = RunFolder.create(RunConfig.from_dict({"name": name}))
    folder.adapter_dir.mkdir()
    (folder.adapter_dir / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank,
                                                                         "lora_alpha": 16}), encoding="utf-8")
    folder.append_event({"type": "JobFinished", "run_dir": str(folder.path), "steps": 3, "final_loss": 1.0})
    return folder


def test_the_adapter_picker_offers_finished_runs_and_checks_the_choice(qtbot, make_studio, tmp_path):
    sft = _adapter_run("sft-first")
    studio = make_studio()
    picker = studio.pages["model"].adapter
    picker.refresh()
    labels = [picker.combo.itemText(i) for i in range(picker.combo.count())]
    assert labels[0].startswith("None") and labels[1].startswith("Run sft-first · lora · 0 steps · finished · ")
    picker.combo.setCurrentIndex(1)
    assert studio.config.get("model.adapter") == str(sft.path) and picker.problem() == ""
    assert f"--set model.adapter={sft.path}" in studio.pages["techniques"].command_line.text()
    studio.config.set("technique.lora_rank", 16)
    assert "technique.lora_rank is 16 but the start adapter" in picker.problem() and "\n" not in picker.problem()
    studio.config.set("technique.lora_rank", 8)
    picker.ask_folder = lambda: str(tmp_path)
    picker.browse_button.click()
    assert "holds no adapter" in picker.problem() and picker.combo.currentText() == f"Folder: {tmp_path}"
    picker.combo.setCurrentIndex(0)
    assert studio.config.get("model.adapter") == "" and picker.problem() == ""


def _metric_run(name: str, objective: str, extra: dict[str, list[float]]) -> RunFolder:
    folder = RunFolder.create(RunConfig.from_dict({"name": name, "technique": {"objective": objective}}))
    steps = len(next(iter(extra.values())))
    for step in range(1, steps + 1):
        folder.append_event({"type": "MetricsLogged", "step": step, "max_steps": steps, "loss": 1.0 / step,
                             "extra": {key: values[step - 1] for key, values in extra.items()}})
    folder.append_event({"type": "JobFinished", "run_dir": str(folder.path), "steps": steps, "final_loss": 0.5})
    return folder


def test_runs_compare_the_objective_metrics_they_logged(qtbot, make_studio):
    a = _metric_run("dpo-beta-0.1", "dpo", {"rewards/margins": [0.1, 0.3, 0.6], "rewards/accuracies": [0.5, 0.7, 0.9]})
    b = _metric_run("dpo-beta-0.5", "dpo", {"rewards/margins": [0.2, 0.2, 0.4]})
    g = _metric_run("grpo", "grpo", {"reward": [0.1, 0.5], "rewards/exact_match/mean": [0.1, 0.5]})
    studio = make_studio()
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    page.select_runs([a.run_id, b.run_id])
    offered = [page.metric_combo.itemData(i) for i in range(page.metric_combo.count())]
    assert offered == ["loss", "rewards/margins", "rewards/accuracies"] and page.metric_combo.isEnabled()
    page.set_metric("rewards/margins")
    assert page.overlay.curve_count() == 2 and "Reward margin" in page.overlay.getPlotItem().titleLabel.text
    page.set_metric("rewards/accuracies")
    assert page.overlay.curve_count() == 1  # only the run that logged it
    page.select_runs([g.run_id])
    assert page.metric() == "loss" and [page.metric_combo.itemText(i) for i in range(page.metric_combo.count())] == [
        "Training loss", "Mean reward", "Reward exact_match (mean)"]
    assert RunMetrics().series(str(g.path), "reward") == ([1.0, 2.0], [0.1, 0.5])


def test_the_evaluate_table_shows_each_objectives_figures(qtbot, make_studio):
    evaluation = make_studio().pages["export"].evaluation
    reward = {"mean": 0.358, "per_function": {"exact_match": 0.358}}
    evaluation.show_report({"base_model": "tiny", "mean_reward": {
        "prompts": 30, "source": "validation prompts", "samples": 4, "temperature": 1.0, "max_new_tokens": 8,
        "base": reward, "tuned": {"mean": 0.692, "per_function": {"exact_match": 0.692}}}})
    assert evaluation.figures() == [("0.358", "0.692"), ("0.358", "0.692")]
    assert evaluation.table.verticalHeaderItem(0).text() == "Mean reward ↑"
    evaluation.show_report({"base_model": "tiny", "preference": {
        "kind": "pairs", "n": 26, "base": {"accuracy": 0.35, "margin": -0.1}, "tuned": {"accuracy": 0.96, "margin": 2.5}}})
    assert evaluation.figures() == [("35.0%", "96.0%"), ("-0.10", "2.50")]
    assert "26 validation pairs" in evaluation.legend.text()
    evaluation.show_report(None)  # back to SFT's two empty rows
    assert evaluation.figures() == [("—", "—"), ("—", "—")] and "validation" not in evaluation.legend.text()
