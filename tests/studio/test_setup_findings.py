"""The setup pages' smaller findings of a walk through the window (issue 33, item 6): each one kept fixed."""

from __future__ import annotations

from tests.fakes.fake_nvml import FakeSampler


def test_the_cards_line_hides_while_there_is_no_estimate(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    estimate, breakdown = studio.estimate, studio.pages["techniques"].breakdown
    qtbot.waitUntil(lambda: bool(estimate.cards) and estimate.breakdown is not None, timeout=10000)
    assert breakdown.cards_label.text().startswith("On CUDA: ") and not breakdown.cards_label.isHidden()
    studio.config.set("train.micro_batch_size", 0)  # invalid: no estimate
    qtbot.waitUntil(lambda: estimate.breakdown is None, timeout=10000)
    assert "No estimate" in breakdown.verdict_label.text()
    assert breakdown.cards_label.isHidden() and breakdown.cards_label.text() == ""


def test_packing_shows_unticked_with_why_while_a_trl_objective_ignores_it(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    page, config = studio.pages["techniques"], studio.config
    config.set("technique.packing", True)
    box = page.editor("technique.packing")
    assert box.isChecked() and box.isEnabled()
    config.set("technique.objective", "dpo")
    assert not box.isChecked() and not box.isEnabled()
    assert "Not used by DPO" in box.toolTip() and "Not used by DPO" in page.labels["technique.packing"].toolTip()
    assert config.get("technique.packing") is True  # the draft keeps the SFT value
    config.set("technique.objective", "sft")
    assert box.isChecked() and box.isEnabled()


def test_offload_activations_is_marked_where_it_cannot_act(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))  # a CPU machine
    page, config, estimate = studio.pages["techniques"], studio.config, studio.estimate
    box, label = page.editor("technique.activation_offload"), page.labels["technique.activation_offload"]
    config.set("technique.activation_offload", False)
    assert not box.isEnabled() and "Does nothing here: needs a CUDA GPU" in label.toolTip()
    estimate.set_card(24)  # the estimate for a 24 GB card: CUDA
    qtbot.waitUntil(lambda: estimate.device == "cuda", timeout=10000)
    config.set("technique.gradient_checkpointing", True)
    config.set("technique.torch_compile", False)
    assert box.isEnabled() and "Does nothing" not in label.toolTip()
    config.set("technique.gradient_checkpointing", False)
    assert not box.isEnabled() and "needs gradient checkpointing" in label.toolTip()
    config.set("technique.activation_offload", True)  # ticked where it does nothing: enabled, to untick it
    assert box.isEnabled() and "needs gradient checkpointing" in label.toolTip() and label.styleSheet()


def _preset(name: str):
    from backend.core.paths import resources_dir

    return resources_dir() / "presets" / f"{name}.yaml"


def test_open_config_updates_the_preset_list_and_the_hub_id(qtbot, make_studio, tmp_path):
    from backend.core.config.run_config import RunConfig
    from studio.app import open_config

    studio = make_studio(sampler=FakeSampler(nvml=False))
    page = studio.pages["model"]
    page.use_preset(_preset("llama-3.1-8b_qlora_16gb"))
    assert page.hub.edit.text().startswith("meta-llama/")  # not downloaded: offered
    assert page.presets.list.currentData() == str(_preset("llama-3.1-8b_qlora_16gb"))
    mine = tmp_path / "mine.yaml"
    RunConfig.from_dict({"name": "mine"}).save(mine)  # the bundled model, no preset
    assert open_config(studio.window, studio.config, str(mine))
    assert page.hub.edit.text() == ""  # Download would no longer fetch the 8B
    assert page.presets.list.currentIndex() == -1 and not page.presets.use.isEnabled()
    assert "mine.yaml, not a preset" in page.presets.about.text()
    preset = _preset("tiny_dpo")
    assert open_config(studio.window, studio.config, str(preset))  # a preset opened as a file: shown
    assert page.presets.list.currentData() == str(preset) and page.presets.use.isEnabled()


def test_starting_over_asks_only_when_the_draft_has_edits(qtbot, make_studio, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMessageBox

    from backend.core.config.run_config import RunConfig
    from studio.app import open_config

    asked: list[str] = []
    answer = QMessageBox.StandardButton.Cancel

    def question(parent, title, text, buttons, default):
        asked.append(text)
        assert buttons & QMessageBox.StandardButton.Discard and default == QMessageBox.StandardButton.Cancel
        return answer

    monkeypatch.setattr(QMessageBox, "question", question)
    studio = make_studio(sampler=FakeSampler(nvml=False))
    config, presets = studio.config, studio.pages["model"].presets
    assert not config.edited()  # the restored model and data are no edits
    presets.chosen.emit(_preset("tiny_dpo"))
    assert asked == [] and config.get("technique.objective") == "dpo"
    config.set("technique.dpo_beta", 0.3)
    presets.chosen.emit(_preset("tiny_kto"))  # Cancel: the draft stays
    assert len(asked) == 1 and "tiny_kto" in asked[0] and config.get("technique.dpo_beta") == 0.3
    mine = tmp_path / "mine.yaml"
    RunConfig.from_dict({"name": "mine"}).save(mine)
    assert not open_config(studio.window, config, str(mine))
    assert len(asked) == 2 and config.get("technique.dpo_beta") == 0.3
    answer = QMessageBox.StandardButton.Discard
    assert open_config(studio.window, config, str(mine))
    assert config.get("name") == "mine" and not config.edited()
    config.set("train.seq_len", 64)
    config.save(tmp_path / "saved.yaml")  # saved: nothing to lose
    presets.chosen.emit(_preset("tiny_kto"))
    assert len(asked) == 3 and config.get("technique.objective") == "kto"  # no question after a save


def test_a_reward_reading_a_column_the_data_lacks_is_flagged_red(qtbot, make_studio):
    from PySide6.QtWidgets import QLabel

    studio = make_studio(sampler=FakeSampler(nvml=False))
    studio.pages["model"].use_preset(_preset("tiny_grpo"))
    summary = studio.pages["techniques"].rewards
    editor = summary.editor
    assert "answer" in editor.columns and summary.problem() == "" and editor.list.item(0).toolTip() == ""
    new = [label.text() for label in editor.findChildren(QLabel)]
    assert "New reward:" in new  # the kind beside Add is the new reward's, not the selected row's
    editor.set_field("column", "solution")  # the Data page reads again with the new column
    assert "answer" in editor.columns
    item = editor.list.item(0)
    assert "the data has no column 'solution'" in item.toolTip() and item.foreground().color().name() == "#dc2626"
    assert summary.problem() == "Reward 1 (exact_match): the data has no column 'solution'"
    assert editor.problem() == summary.problem()
    editor.set_field("column", "answer")
    assert summary.problem() == "" and editor.list.item(0).toolTip() == ""


def test_the_histogram_counts_only_max_examples_with_whole_ticks(qtbot, make_studio, tmp_path):
    import json

    studio = make_studio(sampler=FakeSampler(nvml=False))
    page, histogram = studio.pages["data"], studio.pages["data"].histogram
    path = tmp_path / "three.jsonl"
    rows = [{"instruction": "Say hi", "input": "", "output": "hi"}] * 2 + [
        {"instruction": "Tell a long story " * 30, "input": "", "output": "once upon a time " * 30}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page.choose(str(path))
    studio.config.set("train.seq_len", 64)
    histogram.flush()
    assert histogram.bar_count == 2 and histogram.tallest_bar() == 2 and "33.3%" in page.truncated_label.text()
    studio.config.set("data.max_examples", 2)  # training reads the first two: the long one is not among them
    histogram.flush()
    assert histogram.bar_count == 1 and histogram.tallest_bar() == 2 and "0.0%" in page.truncated_label.text()
    for name in ("left", "bottom"):  # a count of 2 and a few tokens: whole ticks only
        axis = histogram.getPlotItem().getAxis(name)
        low, high = histogram.getPlotItem().getViewBox().viewRange()[0 if name == "bottom" else 1]
        values = [v for _, level in axis.tickValues(low, high, 300) for v in level]
        assert values and all(float(v).is_integer() for v in values), (name, values)
