"""Techniques page: every option with its tooltip, a live memory estimate, and the CLI line."""

from __future__ import annotations

import shlex

from PySide6.QtWidgets import QApplication, QComboBox

from backend.core.config.run_config import RunConfig, TechniqueSection
from studio.widgets.field_editors import description
from tests.fakes.fake_nvml import FakeSampler


def test_every_technique_option_has_an_editor_with_its_description(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["techniques"]
    for name in TechniqueSection.model_fields:
        editor = page.editor(f"technique.{name}")
        assert editor.toolTip() == " ".join(TechniqueSection.model_fields[name].description.split())
    for key in ("train.micro_batch_size", "train.gradient_accumulation_steps", "train.seq_len"):
        assert page.editor(key).toolTip() == description(key)
    method = page.editor("technique.method")
    assert isinstance(method, QComboBox)
    assert [method.itemText(i) for i in range(method.count())] == ["lora", "dora", "qlora", "lora8", "full"]
    assert page.editor("technique.neftune_alpha").specialValueText() == "off"


def test_the_breakdown_follows_every_change(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler())
    page = studio.pages["techniques"]
    before = page.breakdown.part_sizes()
    assert before["adapters"] > 0 and before["master_weights"] == 0
    page.editor("technique.method").setCurrentText("full")
    qtbot.waitUntil(lambda: page.breakdown.part_sizes().get("adapters") == 0, timeout=3000)
    after = page.breakdown.part_sizes()
    assert after["gradients"] > before["gradients"] and after["optimizer"] > before["optimizer"]
    assert not page.editor("technique.lora_rank").isVisibleTo(page)  # LoRA knobs hide for full tuning
    activations = after["activations"]
    page.editor("train.micro_batch_size").setValue(16)
    qtbot.waitUntil(lambda: page.breakdown.part_sizes()["activations"] > activations, timeout=3000)
    rows = page.breakdown.table.rowCount()
    assert rows == len(after) + 1 and page.breakdown.table.item(rows - 1, 0).text() == "Total"


def test_logits_follow_the_longest_answer_the_data_page_measured(qtbot, make_studio, tmp_path):
    """The bundled demo answers are a few tokens: the logits part counts those, not all 8 x 256 positions."""
    from backend.core.data.dataset_profile import DatasetProfile

    studio = make_studio(sampler=FakeSampler())
    page, estimate = studio.pages["techniques"], studio.estimate
    longest = DatasetProfile.read(studio.config.get("data.path"), studio.config.get("model.path")).longest_answer()
    assert longest is not None and longest < 20
    qtbot.waitUntil(lambda: estimate.breakdown.details["logits"]["target_tokens"] == longest, timeout=5000)
    micro_batch = int(studio.config.get("train.micro_batch_size"))
    assert estimate.breakdown.details["logits"]["positions"] == micro_batch * longest
    row = [page.breakdown.table.item(r, 0).text() for r in range(page.breakdown.table.rowCount())].index("Logits / loss")
    assert f"longest answer in the data is {longest} tokens" in page.breakdown.table.item(row, 0).toolTip()
    measured = page.breakdown.part_sizes()["logits"]

    other = tmp_path / "other.jsonl"  # a new file: the old measurement no longer applies
    other.write_text('{"text": "raw text trains on every token"}\n', encoding="utf-8")
    studio.config.set("data.path", str(other))
    qtbot.waitUntil(lambda: page.breakdown.part_sizes()["logits"] > measured, timeout=5000)


def test_fits_and_does_not_fit_against_the_device(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(total=24 << 30))
    breakdown = studio.pages["techniques"].breakdown
    assert breakdown.verdict() == "fits" and "Fits" in breakdown.verdict_label.text()
    assert breakdown.bar.limit == 24 << 30
    small = make_studio(sampler=FakeSampler(total=64 << 20, name="Tiny GPU"))
    breakdown = small.pages["techniques"].breakdown
    assert breakdown.verdict() == "too_big" and "Does not fit" in breakdown.verdict_label.text()
    assert "Tiny GPU" in breakdown.limit_label.text()


def test_command_line_reproduces_the_setup(qtbot, make_studio, tmp_path):
    studio = make_studio()
    page = studio.pages["techniques"]
    line = page.command_line
    assert line.text() == "finetune-studio train resources/presets/tiny_lora.yaml"
    page.editor("technique.lora_rank").setValue(16)
    page.editor("technique.gradient_checkpointing").setChecked(True)
    page.editor("train.learning_rate").setValue(0.0005)
    studio.pages["model"].choose(str(tmp_path / "my model"))
    text = line.text()
    assert "--set technique.lora_rank=16" in text and "--set technique.gradient_checkpointing=true" in text
    args = shlex.split(text)
    sets = [args[i + 1] for i, arg in enumerate(args) if arg == "--set"]
    assert RunConfig.load(args[2], sets).model_dump() == studio.config.config().model_dump()
    line.copy_button.click()
    assert QApplication.clipboard().text() == text
    saved = tmp_path / "run.yaml"
    line.ask_save_path = lambda: str(saved)
    line.save_button.click()
    assert RunConfig.load(saved).technique.lora_rank == 16
    assert line.text() == f"finetune-studio train {saved}"


def test_an_impossible_combination_is_named_and_refused(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["techniques"]
    page.editor("technique.precision").setCurrentText("fp32")
    page.editor("technique.attention").setCurrentText("flash_attention_2")
    assert "flash_attention_2 runs only in bf16 or fp16" in page.problem_label.text()
    studio.train_page.start_button.click()
    assert not studio.client.is_running()
    assert "Cannot start" in studio.train_page.status_label.text()
    qtbot.waitUntil(lambda: "No estimate" in page.breakdown.verdict_label.text(), timeout=3000)


def test_cpu_weights_follow_native_bf16(qtbot, make_studio, monkeypatch):
    """On a CPU run the estimate asks the CPU's flags: native bf16 halves the adapted linears'
    weights (as the worker holds them) and the weights row says so; without it, all fp32."""
    import backend.core.cpu_features

    sizes = {}
    for native in (False, True):
        monkeypatch.setattr(backend.core.cpu_features, "native_bf16", lambda native=native: native)
        studio = make_studio()
        page, estimate = studio.pages["techniques"], studio.estimate
        assert estimate.device == "cpu"
        estimate.recompute()
        sizes[native] = page.breakdown.part_sizes()["weights"]
        row = [page.breakdown.table.item(r, 0).text() for r in range(page.breakdown.table.rowCount())].index("Weights")
        tip = page.breakdown.table.item(row, 0).toolTip()
        assert ("held in bf16" in tip) is native
    linears = 4 * 256 * (256 + 128 + 128 + 256 + 3 * 768)  # the bundled model's adapted linears
    assert sizes[False] - sizes[True] == 2 * linears


def test_the_schedule_fields_are_on_the_page_with_their_tooltips(qtbot, make_studio):
    from PySide6.QtWidgets import QDoubleSpinBox, QSpinBox

    from backend.core.config.schedule import TrainSection

    page = make_studio().pages["techniques"]
    kinds = {"train.max_steps": QSpinBox, "train.num_epochs": QSpinBox, "train.lr_scheduler": QComboBox,
             "train.warmup_steps": QSpinBox, "train.warmup_ratio": QDoubleSpinBox,
             "train.max_grad_norm": QDoubleSpinBox}
    for key, kind in kinds.items():
        editor = page.editor(key)
        assert isinstance(editor, kind) and editor.isVisibleTo(page), key
        assert editor.toolTip() == description(key) == " ".join(TrainSection.model_fields[key[6:]].description.split())
        assert description(key) in page.labels[key].toolTip(), key  # a paired row's label says both
    schedule = page.editor("train.lr_scheduler")
    assert [schedule.itemText(i) for i in range(schedule.count())] == ["linear", "cosine", "constant_with_warmup"]
    assert schedule.currentText() == "linear" and page.editor("train.max_grad_norm").value() == 1.0
    assert page.editor("train.warmup_ratio").maximum() < 1.0  # the field's lt=1


def test_epochs_or_steps_one_rules_and_the_other_shows_what_it_comes_to(qtbot, make_studio):
    """tiny_lora: 600 demo examples, 5% held out: 570 rows at micro-batch 8, 72 steps an epoch."""
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QLineEdit

    from tests.studio.test_command_line_parity import assert_same_run

    studio = make_studio()
    page, config = studio.pages["techniques"], studio.config
    steps, epochs = page.editor("train.max_steps"), page.editor("train.num_epochs")
    assert steps.text() == "60" and epochs.text() == "≈ 0.83"  # 60 / 72
    epochs.setValue(2)
    assert config.get("train.max_steps") is None and config.problem() == ""
    assert steps.text() == "≈ 144" and epochs.text() == "2"
    grey = page.palette().color(QPalette.ColorRole.PlaceholderText)  # the derived one is greyed, not a setting
    assert steps.findChild(QLineEdit).palette().color(QPalette.ColorRole.Text) == grey
    assert epochs.findChild(QLineEdit).palette().color(QPalette.ColorRole.Text) != grey
    assert "2 epochs of 570 rows = 144 steps" in page.labels["train.max_steps"].toolTip()
    line = page.command_line.text()
    assert "--set train.num_epochs=2" in line and "--set train.max_steps=null" in line
    assert_same_run(studio)  # the CLI runs the window's config
    steps.setValue(10)  # the other way round: steps rule again
    assert config.get("train.num_epochs") is None and epochs.text() == "≈ 0.14"
    page.editor("train.warmup_steps").setValue(3)
    page.editor("train.warmup_ratio").setValue(0.1)  # a ratio turns the steps off, as --set does
    assert (config.get("train.warmup_steps"), config.get("train.warmup_ratio")) == (0, 0.1)
    assert config.config().train.warmup_ratio == 0.1


def test_the_derived_length_stays_grey_in_a_new_theme(qtbot, make_studio):
    """A theme change re-polishes every widget; the page greys the derived one of steps and epochs again."""
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication, QLineEdit

    from studio.services.theme import Theme

    app = QApplication.instance()
    palette, sheet = app.palette(), app.styleSheet()
    try:
        page = make_studio().pages["techniques"]
        page.editor("train.num_epochs").setValue(2)
        Theme(app).apply("dark")
        text = page.editor("train.max_steps").findChild(QLineEdit)
        qtbot.waitUntil(lambda: text.palette().color(QPalette.ColorRole.Text)
                        == page.palette().color(QPalette.ColorRole.PlaceholderText), timeout=3000)
    finally:
        app.setStyleSheet(sheet)
        app.setPalette(palette)


def test_the_image_choices_show_only_for_a_vision_language_model(qtbot, make_studio, tmp_path):
    from backend.core.vision_folder import VisionFolder
    from tests import vision_models

    studio = make_studio(sampler=FakeSampler())
    page = studio.pages["techniques"]
    assert not page.vision_box.isVisibleTo(page)  # the bundled text model
    folder = vision_models.build_tiny_vlm("qwen2_5_vl", tmp_path / "vlm")
    studio.config.set("model.path", str(folder))
    assert page.vision_box.isVisibleTo(page)
    assert [page.editor("vision.tower").itemText(i) for i in range(3)] == ["frozen", "lora", "full"]
    vision = VisionFolder.read(folder)
    assert page.image_cost_label.text() == f"about {vision.tokens_per_image(1024, 768):,} tokens per 1024×768 image"
    studio.config.set("vision.max_pixels", 31_360)
    smaller = vision.tokens_per_image(1024, 768, 31_360)
    assert page.image_cost_label.text() == f"about {smaller:,} tokens per 1024×768 image"
    assert smaller < vision.tokens_per_image(1024, 768)
    studio.config.set("model.path", "bundled:tiny")
    assert not page.vision_box.isVisibleTo(page)
