"""Model page: what a model folder is, read from config.json; remote code off unless ticked."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from backend.estimate import count_params, read_dims
from studio.services.model_info import ModelInfo
from tests.conftest import BUNDLED_MODEL


def _remote_code_model(folder: Path) -> Path:
    config = json.loads((BUNDLED_MODEL / "config.json").read_text())
    config.update(model_type="mystery", architectures=["MysteryForCausalLM"], max_position_embeddings=8192,
                  auto_map={"AutoModelForCausalLM": "modeling_mystery.MysteryForCausalLM"},
                  dtype="bfloat16")
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_model_info_of_the_bundled_model():
    info = ModelInfo.read("bundled:tiny")
    raw = json.loads((BUNDLED_MODEL / "config.json").read_text())
    arch, dims, _ = read_dims(raw)
    assert info.problem == ""
    assert info.parameters == count_params(arch, dims).total
    assert info.architecture == "LlamaForCausalLM" and info.context_length == raw["max_position_embeddings"]
    assert info.dtype == "float32" and not info.needs_remote_code and info.has_tokenizer
    assert info.weights == "safetensors"


def test_model_info_problems_are_sentences(tmp_path):
    assert "no such folder" in ModelInfo.read(str(tmp_path / "nope")).problem
    assert "no config.json" in ModelInfo.read(str(tmp_path)).problem
    (tmp_path / "config.json").write_text("{not json")
    assert "not readable JSON" in ModelInfo.read(str(tmp_path)).problem


def test_page_shows_the_bundled_model(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["model"]
    facts = {key: label.text() for key, label in page.facts.items()}
    assert facts["architecture"] == "LlamaForCausalLM (llama)"
    assert f"({page.info.parameters:,})" in facts["parameters"]
    assert facts["context"] == "1,024 tokens" and facts["dtype"] == "float32"
    assert "no auto_map" in page.trust_note.text()
    assert not page.trust_check.isChecked()
    assert "HF_HUB_OFFLINE" in page.hub.note.text() and not page.hub.edit.isEnabled()  # tests run offline


def test_remote_code_needs_the_box_ticked(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["model"]
    folder = _remote_code_model(tmp_path / "mystery")
    chosen: list[str] = []
    page.model_chosen.connect(chosen.append)
    page.path_edit.setText(str(folder))
    page.path_edit.editingFinished.emit()
    assert chosen == [str(folder)] and studio.config.get("model.path") == str(folder)
    assert page.facts["context"].text() == "8,192 tokens" and page.facts["dtype"].text() == "bfloat16"
    assert "ships its own Python code" in page.trust_note.text() and "not ticked" in page.trust_note.text()
    assert studio.config.get("model.trust_remote_code") is False
    page.trust_check.setChecked(True)
    assert studio.config.get("model.trust_remote_code") is True
    assert "its code will run" in page.trust_note.text()
    assert "model.trust_remote_code=true" in studio.pages["techniques"].command_line.text()


def test_dropping_a_folder_chooses_it(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["model"]
    folder = _remote_code_model(tmp_path / "dropped")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(folder / "config.json"))])
    event = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    page.dropEvent(event)
    assert studio.config.get("model.path") == str(folder)
    assert page.path_edit.text() == str(folder)
    assert studio.settings.last_model == str(folder)  # remembered for the next session


def test_a_missing_folder_is_reported_on_the_page(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["model"]
    page.choose(str(tmp_path / "missing"))
    assert "no such folder" in page.problem_label.text()
    assert page.facts["parameters"].text() == "unknown"
    page.choose("bundled:tiny")
    assert page.problem_label.text() == ""


def _vlm_folder(folder: Path, fixture: str, **processor) -> Path:
    from tests import model_configs

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model_configs.load(fixture)))
    if processor:
        (folder / "preprocessor_config.json").write_text(json.dumps(processor))
    return folder


def test_page_shows_a_vision_language_model_and_its_parts(qtbot, make_studio, tmp_path, monkeypatch):
    import studio.widgets.vision_facts_widget as box

    counted = []
    monkeypatch.setattr(box, "part_counts", lambda folder: counted.append(folder) or
                        {"vision tower": 631_975_680, "projector": 44_574_464, "language model": 7_615_616_512})
    studio = make_studio()
    page = studio.pages["model"]
    folder = _vlm_folder(tmp_path / "qwen25vl", "Qwen--Qwen2.5-VL-7B-Instruct", max_pixels=12845056, min_pixels=3136)
    page.choose(str(folder))
    qtbot.waitUntil(lambda: "total" in page.vision.values["parts"].text(), timeout=10_000)
    shown = {key: label.text() for key, label in page.vision.values.items()}
    assert not page.vision.isHidden() and counted == [folder]
    assert shown["family"].startswith("Qwen2.5-VL (qwen2_5_vl)") and "151655" in shown["family"]
    assert shown["tower"] == "32 layers · width 1280 · patch 14" and shown["projector"] == "model.visual.merger"
    assert shown["tokens"].startswith("999 for a 1024×768 image; up to 16,384 (max_pixels 12,845,056")
    assert "vision tower 632.0 M" in shown["parts"] and "8,292,166,656" in shown["parts"]
    page.choose("bundled:tiny")
    assert page.vision.isHidden()


def test_page_refuses_an_unproven_vision_family_in_one_line(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["model"]
    folder = tmp_path / "pali"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "paligemma", "image_token_index": 257152,
                                                    "vision_config": {"model_type": "siglip_vision_model"}}))
    page.choose(str(folder))
    text = page.problem_label.text()
    assert "'paligemma' is a vision-language model this studio has not proven; proven: Qwen2.5-VL" in text
    assert "\n" not in text and page.vision.isHidden()
