"""Data page: formats detected with the worker's reader, conversations previewed, lengths measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.data.dataset_profile import DatasetProfile

LONG = " ".join(["word"] * 400)
FILES = {
    "alpaca.jsonl": [{"instruction": "Say hi", "input": "", "output": "hi"},
                     {"instruction": "Long one", "input": LONG, "output": "ok"}],
    "sharegpt.json": [{"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hey"}]}],
    "messages.jsonl": [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
                                     {"role": "assistant", "content": "a"}]}],
}


def _write(folder: Path, name: str) -> Path:
    path = folder / name
    records = FILES[name]
    if name.endswith(".jsonl"):
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    else:
        path.write_text(json.dumps(records))
    return path


@pytest.mark.parametrize("name,fmt", [("alpaca.jsonl", "alpaca"), ("sharegpt.json", "sharegpt"),
                                      ("messages.jsonl", "messages")])
def test_profile_detects_the_format(tmp_path, name, fmt):
    profile = DatasetProfile.read(str(_write(tmp_path, name)), "bundled:tiny")
    assert profile.problem == "" and profile.format == fmt
    assert profile.count == len(FILES[name]) and profile.tokenizer.endswith("tokenizer.json")
    assert any(m["role"] == "assistant" for m in profile.preview[0])


def test_profile_of_text_and_of_a_broken_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("first document\n\nsecond document")
    profile = DatasetProfile.read(str(text), "")
    assert profile.format == "text" and profile.count == 2 and profile.tokenizer == ""  # word-count estimate
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "ok"}\n{oops\n')
    profile = DatasetProfile.read(str(broken))
    assert "line 2" in profile.problem and "not valid JSON" in profile.problem


def test_page_previews_conversations_and_marks_what_is_trained(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    assert page.profile is not None and page.profile.format == "alpaca"  # the bundled demo set
    assert page.profile.count == 600
    page.choose(str(_write(tmp_path, "messages.jsonl")))
    assert "<b>messages</b>" in page.summary_label.text()
    html = page.preview.toPlainText()
    assert "system" in html and "user" in html and "assistant" in html and "trained on" in html
    assert page.preview.trained_count == 1
    assert studio.settings.last_dataset == str(tmp_path / "messages.jsonl")


def test_histogram_marks_seq_len_and_the_share_truncated(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    page.choose(str(_write(tmp_path, "alpaca.jsonl")))
    studio.config.set("train.seq_len", 64)
    page.histogram.flush()
    assert page.histogram.line_position() == 64 and page.histogram.bar_count == 2
    assert "50.0%" in page.truncated_label.text() and "truncated" in page.truncated_label.text()
    assert "Approximate" in page.approx_label.text() and "chat template" in page.approx_label.text()
    studio.config.set("data.truncate", False)
    assert "50.0%" in page.truncated_label.text() and "refused" in page.truncated_label.text()
    studio.config.set("train.seq_len", 1024)
    assert "0.0%" in page.truncated_label.text() and "no example is longer" in page.truncated_label.text()
    answer = page.profile.longest_answer()
    assert answer and f"longest answer {answer:,} tokens" in page.truncated_label.text()


def test_histogram_y_axis_fits_the_counts_without_a_double_click(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"instruction": "Say hi", "input": "", "output": "hi"}) + "\n"
                            for _ in range(30)))
    page.choose(str(path))
    page.histogram.flush()
    y_low, y_high = page.histogram.getPlotItem().getViewBox().viewRange()[1]
    assert page.histogram.tallest_bar() == 30 and y_low == 0 and 30 <= y_high <= 36


def test_split_spin_box_sets_the_validation_split(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["data"]
    spin = next(w for w in studio.editors.editors["data.validation_split"] if page.isAncestorOf(w))
    spin.setValue(0.2)
    assert studio.config.get("data.validation_split") == pytest.approx(0.2)
    assert page.split_label.text() == "480 train · 120 validation"
    assert "data.validation_split=0.2" in studio.pages["techniques"].command_line.text()


def test_an_unreadable_dataset_is_a_sentence_not_a_crash(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    page.choose(str(tmp_path / "missing.jsonl"))
    assert "not found" in page.summary_label.text()
    assert page.histogram.bar_count == 0 and page.preview.trained_count == 0


def test_background_read_delivers_the_newest_file(qtbot, tmp_path):
    from studio.services.background_call import BackgroundCall

    call = BackgroundCall()
    got: list = []
    call.finished.connect(got.append)
    call.call(lambda: DatasetProfile.read(str(_write(tmp_path, "alpaca.jsonl"))))
    call.call(lambda: DatasetProfile.read(str(_write(tmp_path, "sharegpt.json"))))
    qtbot.waitUntil(lambda: not call.is_busy(), timeout=10_000)
    assert [p.format for p in got] == ["sharegpt"]


def test_page_reads_a_csv_and_the_skip_box_turns_a_refusal_into_a_note(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["data"]
    path = tmp_path / "train.csv"
    path.write_text("instruction,input,output\nSay hi,,hi\nNo answer,,\n")
    page.choose(str(path))
    assert "1 of 2 examples has an empty or null output (first: line 3)" in page.summary_label.text()
    box = next(w for w in studio.editors.editors["data.skip_invalid"] if page.isAncestorOf(w))
    box.setChecked(True)
    assert studio.config.get("data.skip_invalid") is True
    assert "<b>alpaca</b> · 1 examples" in page.summary_label.text() and "skipped 1 of 2" in page.summary_label.text()


def test_rows_with_images_show_thumbnails_and_their_tokens(qtbot, make_studio):
    """LLaMA-Factory's mllm_demo as it is: a thumbnail per image beside its row, the tokens with the
    image tokens counted once the model's rule is given, and the histogram's text-only outline."""
    from PySide6.QtCore import QUrl

    from tests.backend.test_image_data import PEER

    studio = make_studio()
    page = studio.pages["data"]
    page.choose(str(PEER / "mllm_demo.json"))  # the bundled model is text-only: refused, as training would
    assert "vision-language model" in page.summary_label.text()
    page.model_rules = lambda folder: (None, None)  # a VLM whose image tokens are unknown
    page.reload()
    assert "· 6 examples · 8 images" in page.summary_label.text()
    assert page.preview.thumbnail_count == 7  # the first five rows hold 2 + 1 + 1 + 2 + 1 images
    shown = page.preview.toPlainText()
    assert "[image 1]Who are they?" in shown and "text tokens + 2 images" in shown
    assert "Images not counted" in page.approx_label.text() and not page.histogram.shows_text_outline
    image = page.preview.loadResource(2, QUrl("thumb:1-1"))  # 2: QTextDocument.ImageResource
    assert max(image.width(), image.height()) == 72 and image.pixel(1, 1) != image.pixel(40, 30)
    page.model_rules = lambda folder: (lambda width, height: (width // 28) * (height // 28), None)
    page.reload()
    assert "tokens (" in page.preview.toPlainText() and "for 2 images)" in page.preview.toPlainText()
    page.histogram.flush()
    assert page.histogram.shows_text_outline and "orange outline" in page.approx_label.text()
