"""Desktop manners: remembered settings, themes, icons, the environment line, the close guard."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from PySide6.QtGui import QImage, QPalette

from tests.fakes import fake_command
from tests.fakes.fake_nvml import FakeSampler

ICONS = Path(__file__).resolve().parents[2] / "resources" / "icons"


def test_settings_remember_model_dataset_theme_page_and_geometry(qtbot, make_studio, tmp_path):
    studio = make_studio()
    model = tmp_path / "model"
    model.mkdir()
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "hello"}\n')
    studio.pages["model"].choose(str(model))
    studio.pages["data"].choose(str(data))
    studio.window.theme_actions["dark"].trigger()
    studio.window.show_page("techniques")
    studio.window.resize(1000, 700)
    assert studio.window.close()  # idle: closes at once, saving the layout
    again = make_studio()
    assert again.config.get("model.path") == str(model)
    assert again.config.get("data.path") == str(data)
    assert again.settings.theme == "dark" and again.window.theme_actions["dark"].isChecked()
    assert again.window.current_page() == "techniques"
    assert again.settings.restore_window(again.window) and again.window.height() == 700  # (offscreen: 800 px wide)
    data.unlink()  # a remembered file that is gone falls back to the preset
    third = make_studio()
    assert third.config.get("data.path") == "bundled:datasets/demo_train.jsonl"
    third.window.theme_actions["system"].trigger()


def test_dark_and_light_themes_change_the_palette(qtbot, make_studio):
    from PySide6.QtWidgets import QApplication

    studio = make_studio()
    theme = studio.extras["theme"]
    theme.apply("dark")
    assert QApplication.palette().color(QPalette.ColorRole.Window).lightness() < 80
    theme.apply("light")
    assert QApplication.palette().color(QPalette.ColorRole.Window).lightness() > 180
    theme.apply("system")  # offscreen reports no scheme: light
    assert not theme.is_dark()


def test_environment_line_before_and_after_a_worker(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=FakeSampler(nvml=False))
    label = studio.window.env_label
    assert label.text().startswith("CUDA: no")
    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    assert f"bitsandbytes: {'yes' if has_bnb else 'no'}" in label.text()
    assert "flash-attn" in label.text() and "DeepSpeed" in label.text()
    assert "not yet confirmed by a worker" in label.toolTip()
    assert "falls back" in label.toolTip()
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=30_000)
    assert "reported by the worker" in label.toolTip()
    assert studio.controller.capabilities is not None


def test_app_icon_renders_at_every_size_and_page_icons_exist():
    for size in (16, 32, 48, 64, 128, 256):
        image = QImage(str(ICONS / f"app-{size}.png"))
        assert (image.width(), image.height()) == (size, size)
        assert image.pixelColor(size // 2, size // 2).alpha() > 0  # drawn, not transparent
    for name in ("app", "model", "data", "techniques", "train", "runs", "start", "stop", "cancel", "resume"):
        assert (ICONS / f"{name}.svg").is_file()
    assert (ICONS / "make_icons.py").is_file()


def test_make_icons_renders_a_png(qtbot, tmp_path):
    spec = importlib.util.spec_from_file_location("make_icons", ICONS / "make_icons.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "app-40.png"
    module.render(ICONS / "app.svg", 40, out)
    assert QImage(str(out)).width() == 40


def test_page_list_switches_pages(qtbot, make_studio):
    studio = make_studio()
    window = studio.window
    for key in ("model", "data", "techniques", "train", "runs"):
        window.show_page(key)
        assert window.stack.currentWidget() is studio.pages[key]
        assert window.current_page() == key
