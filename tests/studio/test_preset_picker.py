"""Model page presets: listed by card size, and one click starts the draft over from the preset."""

from __future__ import annotations

from pathlib import Path

from backend.core.paths import hub_folder, resolve_resource
from backend.api.presets import list_presets
from studio.widgets.preset_picker_widget import GIB, PresetPickerWidget


def titles(widget: PresetPickerWidget) -> list[str]:
    return [widget.list.itemText(i) for i in range(widget.list.count())]


def test_the_card_filter_shows_what_fits(qtbot):
    widget = PresetPickerWidget()
    qtbot.addWidget(widget)
    everything = titles(widget)
    assert len(everything) == len(list_presets()) >= 10
    widget.set_card_memory(int(23.6 * GIB))  # what an RTX 4090 reports
    assert widget.card.currentText() == "24 GB"
    shown = widget.shown()
    assert shown and all(p.card_gb * p.cards <= 24 for p in shown)
    assert any(p.card_gb == 24 for p in shown) and not any(p.card_gb >= 48 for p in shown)
    assert widget.selected().card_gb == 24  # the suggestion is one sized for this card, not the CPU demo
    widget.card.setCurrentIndex(widget.card.findData(160))
    assert titles(widget) == everything  # the two-GPU filter reaches every preset
    widget.set_card_memory(4 * GIB)  # smaller than any card size: the filter stays where it was
    assert widget.card.currentData() == 160


def test_using_a_preset_replaces_the_draft_and_offers_the_download(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["model"]
    picker = page.presets
    picker.card.setCurrentIndex(0)
    index = next(i for i in range(picker.list.count()) if "Qwen2.5-0.5B" in picker.list.itemText(i))
    picker.list.setCurrentIndex(index)
    assert "Qwen/Qwen2.5-0.5B-Instruct" in picker.about.text()
    picker.use.click()
    assert studio.config.get("model.path") == "hub:Qwen/Qwen2.5-0.5B-Instruct"
    assert Path(studio.config.source).name == "qwen2.5-0.5b_lora_8gb.yaml"
    assert studio.config.overrides() == []  # the command line is the preset itself
    assert page.hub.edit.text() == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "not downloaded yet" in page.problem_label.text()


def test_hub_paths_name_the_download_folder(studio_home):
    assert resolve_resource("hub:Qwen/Qwen2.5-0.5B") == hub_folder("Qwen/Qwen2.5-0.5B")
    assert hub_folder("Qwen/Qwen2.5-0.5B") == studio_home / "models" / "Qwen--Qwen2.5-0.5B"


def test_the_list_first_shows_the_preset_the_draft_was_loaded_from(qtbot, make_studio):
    from backend.core.paths import resources_dir

    studio = make_studio()
    picker = studio.pages["model"].presets
    assert studio.config.source is not None and studio.config.source.name == "tiny_lora.yaml"
    assert picker.selected().path == studio.config.source  # not the first preset in the list's order
    assert picker.list.itemData(0) != str(studio.config.source)  # (which is another one)
    picker.set_card_memory(int(23.6 * GIB))  # the loaded one fits a 24 GB card: it stays shown
    assert picker.selected().path == studio.config.source
    studio.pages["model"].use_preset(resources_dir() / "presets" / "tiny_kto.yaml")
    assert picker.selected().path.name == "tiny_kto.yaml"
