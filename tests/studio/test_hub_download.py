"""Hub downloads: the real huggingface_hub client against a local fake Hub; progress, cancel and resume,
one-line errors, and the downloaded folder becomes the chosen model."""

from __future__ import annotations

import filecmp
import shutil

import pytest

from studio.services.hub_download import check_hub_id, target_folder
from studio.widgets.hub_download_widget import HubDownloadWidget
from tests.conftest import BUNDLED_MODEL
from tests.fakes.fake_hub import FakeHub

REPO = "acme/tiny-llama"


@pytest.fixture
def online(monkeypatch):
    """Lift the test suite's HF_HUB_OFFLINE for a test that talks only to the local fake Hub."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


def _widget(qtbot, endpoint: str) -> HubDownloadWidget:
    widget = HubDownloadWidget(endpoint)
    qtbot.addWidget(widget)
    return widget


def _wait_idle(qtbot, widget: HubDownloadWidget, timeout: int = 60_000) -> None:
    qtbot.waitUntil(lambda: not widget.download.is_running() and widget.button.text() == "Download",
                    timeout=timeout)


def test_offline_row_says_why(qtbot, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    widget = _widget(qtbot, None)
    assert not widget.edit.isEnabled() and not widget.button.isEnabled()
    assert "HF_HUB_OFFLINE" in widget.note.text()


def test_ids_are_checked_before_any_request():
    assert check_hub_id("Qwen/Qwen2.5-0.5B") == ""
    assert "not a hub id" in check_hub_id("just-a-name")
    assert "not a hub id" in check_hub_id("a/b/c")
    assert "type a hub id" in check_hub_id("")


def test_download_becomes_the_chosen_model(qtbot, make_studio, online):
    studio = make_studio()
    page = studio.pages["model"]
    page.hub.refresh_availability()
    assert page.hub.edit.isEnabled()
    with FakeHub(REPO, BUNDLED_MODEL) as hub:
        page.hub.download.endpoint = hub.endpoint
        seen = []
        files = []
        page.hub.download.progress.connect(lambda p: (seen.append((p.done, p.total)), files.append(p.file)))
        page.hub.edit.setText(REPO)
        page.hub.button.click()
        assert page.hub.button.text() == "Cancel" and page.hub.bar.isVisible()
        _wait_idle(qtbot, page.hub)
    folder = target_folder(REPO)
    assert studio.config.get("model.path") == str(folder)
    assert page.facts["architecture"].text() == "LlamaForCausalLM (llama)"
    for source in BUNDLED_MODEL.iterdir():
        assert filecmp.cmp(source, folder / source.name, shallow=False), source.name
    total = sum(p.stat().st_size for p in BUNDLED_MODEL.iterdir())
    assert seen[-1] == (total, total) and all(done <= total for done, _ in seen)
    assert files.count("model.safetensors") >= 16  # the 16 MiB of weights report (and can stop) every MiB
    assert "Downloaded to" in page.hub.note.text()


def test_cancel_then_resume(qtbot, online, tmp_path):
    source = tmp_path / "repo"
    shutil.copytree(BUNDLED_MODEL, source)
    widget = _widget(qtbot, None)
    chosen: list[str] = []
    widget.downloaded.connect(chosen.append)
    with FakeHub(REPO, source, delay=0.02) as hub:  # 16 MB of weights at 64 KiB per 20 ms: ~5 s
        widget.download.endpoint = hub.endpoint
        widget.edit.setText(REPO)
        widget.button.click()
        qtbot.waitUntil(lambda: "model.safetensors" in widget.note.text(), timeout=30_000)
        widget.button.click()  # Cancel
        _wait_idle(qtbot, widget)
        assert chosen == [] and "Cancelled" in widget.note.text() and "only the rest" in widget.note.text()
        weights = target_folder(REPO) / "model.safetensors"
        assert not weights.exists() or weights.stat().st_size < (source / "model.safetensors").stat().st_size
        hub.delay = 0.0
        widget.button.click()
        _wait_idle(qtbot, widget)
        config_gets = [r for r in hub.requests if r.startswith("GET") and r.endswith("/config.json")]
        assert len(config_gets) == 1, "the second download fetched a completed file again"
    assert chosen == [str(target_folder(REPO))]
    assert filecmp.cmp(source / "model.safetensors", target_folder(REPO) / "model.safetensors", shallow=False)


@pytest.mark.parametrize("repo, gated, expected", [("acme/other", False, "no model 'acme/other'"),
                                                   (REPO, True, "is gated")])
def test_errors_are_one_line(qtbot, online, repo, gated, expected):
    widget = _widget(qtbot, None)
    with FakeHub(REPO, BUNDLED_MODEL, gated=gated) as hub:
        widget.download.endpoint = hub.endpoint
        widget.edit.setText(repo)
        widget.button.click()
        _wait_idle(qtbot, widget)
    assert expected in widget.note.text() and "\n" not in widget.note.text()


def test_unreachable_hub(qtbot, online):
    widget = _widget(qtbot, "http://127.0.0.1:9")  # discard port: nothing listens
    widget.edit.setText(REPO)
    widget.button.click()
    _wait_idle(qtbot, widget)
    assert "could not reach http://127.0.0.1:9" in widget.note.text()


def test_closing_mid_download_stops_the_thread(qtbot, online, tmp_path):
    """Quitting the studio while a download runs cancels it and waits: no thread outlives the window."""
    import time

    source = tmp_path / "repo"
    shutil.copytree(BUNDLED_MODEL, source)
    widget = _widget(qtbot, None)
    with FakeHub(REPO, source, delay=0.05) as hub:
        widget.download.endpoint = hub.endpoint
        widget.edit.setText(REPO)
        widget.button.click()
        qtbot.waitUntil(lambda: "model.safetensors" in widget.note.text(), timeout=30_000)
        started = time.monotonic()
        widget.shutdown()
        assert not widget.download.is_running() and time.monotonic() - started < 10
