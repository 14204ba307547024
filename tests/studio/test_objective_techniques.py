"""Techniques page, objectives: the chosen objective's settings only, the reward editor, every method beyond SFT."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel

from backend.core.config.run_config import RunConfig
from studio.pages.techniques_page import OBJECTIVE_ONLY, OBJECTIVE_TIPS
from tests.studio.test_command_line_parity import assert_same_run, cli_config


def _shown(page, key: str) -> bool:
    return page.editor(key).isVisibleTo(page)


def test_switching_the_objective_shows_its_settings_only(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["techniques"]
    combo = page.editor("technique.objective")
    assert [combo.itemText(i) for i in range(combo.count())] == ["sft", "dpo", "kto", "grpo"]
    for index in range(combo.count()):  # each item says what data it needs and what it teaches
        assert "Data:" in combo.itemData(index, Qt.ItemDataRole.ToolTipRole)
    assert set(OBJECTIVE_TIPS) == {"sft", "dpo", "kto", "grpo"}
    for objective in ("sft", "dpo", "kto", "grpo"):
        combo.setCurrentText(objective)
        assert studio.config.get("technique.objective") == objective
        for key, owner in OBJECTIVE_ONLY.items():
            assert _shown(page, key) == (owner == objective), (objective, key)
        assert page.rewards.isVisibleTo(page) == (objective == "grpo")
    combo.setCurrentText("dpo")
    page.editor("technique.dpo_beta").setValue(0.25)
    assert "--set technique.objective=dpo" in page.command_line.text()
    assert cli_config(page.command_line.text()).technique.dpo_beta == 0.25
    assert_same_run(studio)


def test_every_method_this_machine_runs_stays_offered_beyond_sft(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["techniques"]
    method = page.editor("technique.method")
    model = method.model()
    assert isinstance(model, QStandardItemModel)
    enabled = {method.itemText(i): model.item(i).isEnabled() for i in range(method.count())}
    page.editor("technique.objective").setCurrentText("grpo")
    assert {method.itemText(i): model.item(i).isEnabled() for i in range(method.count())} == enabled
    studio.config.set("technique.method", "full")
    assert page.problem_label.text() == "" or "model.adapter" not in page.problem_label.text()
    studio.config.set("model.adapter", "bundled:adapters/tiny-yes-no")  # full tuning has no adapter to continue
    assert "model.adapter continues an adapter" in page.problem_label.text()


def test_reward_editor_add_edit_remove_round_trip_into_the_config(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["techniques"]
    studio.config.set("data.path", "bundled:datasets/demo_grpo.jsonl")  # prompts with the 'answer' the reward reads
    page.editor("technique.objective").setCurrentText("grpo")
    page.rewards.edit_button.click()
    editor = page.rewards.editor
    assert page.rewards.dialog.isVisible() and editor.isVisible()
    assert editor.list.count() == 1 and editor.problem() == ""  # the default exact_match reward
    editor.new_kind.setCurrentText("regex")
    editor.add_button.click()
    assert editor.list.count() == 2 and "needs pattern" in editor.problem()
    assert "Reward 2 (regex)" in editor.problem() and "\n" not in editor.problem()
    assert not editor.fields["column"].isVisibleTo(editor) and editor.fields["pattern"].isVisibleTo(editor)
    assert "grpo.rewards" in studio.config.problem()
    assert page.rewards.problem() == editor.problem()  # the page says it too, under the rewards' lines
    editor.fields["pattern"].setText("^(yes|no)$")
    editor.fields["pattern"].editingFinished.emit()
    editor.weight.setValue(0.5)
    assert editor.problem() == "" and studio.config.problem() == ""
    assert page.rewards.text().splitlines() == ["exact_match · answer · ×1", "regex · ^(yes|no)$ · ×0.5"]
    assert "regex · ^(yes|no)$ · weight 0.5" in page.rewards.lines.toolTip()
    assert not page.rewards.problem_label.isVisibleTo(page)
    editor.add("python")
    rewards_file = tmp_path / "my_rewards.py"
    rewards_file.write_text("raise SystemExit('the studio must never import this')\n", encoding="utf-8")
    editor.ask_file = lambda: str(rewards_file)
    editor.browse_button.click()
    assert "needs file" in editor.problem()
    editor.set_field("function", "short_answers")
    editor.add("banned")
    editor.set_field("strings", ["As an AI", "a, b"])
    assert editor.problem() == ""
    config = studio.config.config()
    assert [r.kind for r in config.grpo.rewards] == ["exact_match", "regex", "python", "banned"]
    assert config.grpo.rewards[1].pattern == "^(yes|no)$" and config.grpo.rewards[1].weight == 0.5
    assert config.grpo.rewards[2].file == str(rewards_file) and config.grpo.rewards[3].strings == ["As an AI", "a, b"]
    assert_same_run(studio)  # the command line carries the list of dicts and parses back to the same run
    saved = tmp_path / "grpo.yaml"
    page.command_line.ask_save_path = lambda: str(saved)
    page.command_line.save_button.click()
    assert RunConfig.load(saved).grpo.rewards == config.grpo.rewards
    editor.list.setCurrentRow(0)
    editor.remove_button.click()
    assert [r["kind"] for r in studio.config.get("grpo.rewards")] == ["regex", "python", "banned"]
    for _ in range(3):
        editor.remove(0)
    assert "at least one reward" in editor.problem() and studio.config.problem()
    assert page.rewards.text() == "none" and "at least one reward" in page.rewards.problem()
    page.rewards.dialog.close()
    assert studio.config.get("grpo.rewards") == []  # closing keeps what was edited: there is no Apply


def test_a_loaded_grpo_preset_fills_the_editor(qtbot, make_studio):
    from backend.core.paths import resources_dir

    studio = make_studio()
    studio.pages["model"].use_preset(resources_dir() / "presets" / "tiny_grpo.yaml")
    page = studio.pages["techniques"]
    assert page.editor("technique.objective").currentText() == "grpo"
    assert page.editor("grpo.max_completion_length").value() == 8 and _shown(page, "grpo.num_generations")
    assert page.rewards.editor.rewards() == [{"kind": "exact_match", "column": "answer", "weight": 1.0}]
    assert page.command_line.text().endswith("tiny_grpo.yaml")


def test_yaml_scalar_writes_reward_dicts_that_parse_back():
    from backend.core.config.run_config import apply_overrides, yaml_scalar

    rewards = [{"kind": "regex", "pattern": "^(yes|no)$, a: b {x} #c", "weight": 0.5},
               {"kind": "banned", "strings": ["a,b", "it's", " padded", "123", "off"], "weight": 1.0},
               {"kind": "python", "file": "/tmp/my rewards.py", "function": "f", "weight": -1.0}]
    raw: dict = {}
    apply_overrides(raw, [f"grpo.rewards={yaml_scalar(rewards)}"])
    assert raw["grpo"]["rewards"] == rewards
    from backend.core.config.help import fields_epilog

    assert "grpo.rewards  (list of RewardSpec, default [{kind: exact_match}])" in fields_epilog(100)


def test_packing_and_the_speed_shortcuts_are_off_with_the_reason_for_every_trl_objective(qtbot, make_studio):
    from studio.widgets.field_editors import description

    studio = make_studio()
    page = studio.pages["techniques"]
    for objective in ("dpo", "kto", "grpo"):
        studio.config.set("technique.objective", objective)
        for key in ("technique.packing", "technique.shortcuts"):
            editor = page.editor(key)
            assert not editor.isEnabled(), (objective, key)
            assert f"Not used by {objective.upper()}" in editor.toolTip() == page.labels[key].toolTip()
    studio.config.set("technique.objective", "sft")
    packing = page.editor("technique.packing")
    assert packing.isEnabled() and packing.toolTip() == description("technique.packing")
    assert page.editor("technique.shortcuts").isEnabled()
