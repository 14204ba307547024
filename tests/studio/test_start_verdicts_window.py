"""The window's Start follows every verdict `train` refuses with (backend.estimate.start_verdicts): a model
folder with config.json alone still estimates but Start waits for its weights, an estimate over the
GPU's memory offers "Start anyway" (recorded in the run folder), a data file deleted since it was
chosen is caught when Start is pressed; the Train page never says "Ready" beside a disabled Start.
The Model page's "Config only" fetches config.json alone from a (fake, local) Hub."""

from __future__ import annotations

import json
import shutil

from backend.core.paths import runs_dir
from studio.run_controller import NOT_READY
from studio.services.hub_download import target_folder
from tests.conftest import BUNDLED_MODEL
from tests.fakes import fake_command
from tests.fakes.fake_hub import FakeHub
from tests.fakes.fake_nvml import FakeSampler

NO_GPU = FakeSampler(nvml=False)
TINY_GPU = FakeSampler(total=64 << 20, name="Fake GPU 64M")


def blocked(studio) -> bool:
    return not studio.window.start_action.isEnabled() and not studio.train_page.start_button.isEnabled()


def test_config_only_folder_estimates_but_start_waits_for_weights(qtbot, make_studio, tmp_path):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(BUNDLED_MODEL / "config.json", folder / "config.json")
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)
    studio.config.set("model.path", str(folder))
    qtbot.waitUntil(lambda: blocked(studio), timeout=5000)
    assert studio.estimate.breakdown is not None  # the estimate is shown all the same
    line = studio.estimate.start_blocker().splitlines()[0]
    assert line == f"model.path: no weight files in {folder} (only config.json is enough to estimate, not to train)"
    page = studio.train_page
    assert line in page.blocker_label.text() and not page.start_anyway_button.isVisibleTo(page)
    assert page.status_label.text() == NOT_READY and "Ready" not in studio.window.run_status.text()
    studio.train_page.start_button.click()
    assert not studio.client.is_running() and not runs_dir().exists()


def test_over_memory_offers_start_anyway_and_records_it(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=TINY_GPU)
    page = studio.train_page
    qtbot.waitUntil(lambda: studio.estimate.limit_bytes == 64 << 20 and blocked(studio), timeout=10_000)
    line = studio.estimate.start_blocker()
    assert line.startswith("memory: the estimate is ") and "over the 64.0 MiB of GPU 0 (Fake GPU 64M)" in line
    assert line.endswith("or press Start anyway if you know better") and "the largest parts: " in line
    assert page.start_anyway_button.isVisibleTo(page) and page.status_label.text() == NOT_READY
    page.start_anyway_button.click()
    qtbot.waitUntil(lambda: studio.controller.folder is not None, timeout=5000)
    record = json.loads((studio.controller.folder.path / "started_anyway.json").read_text())
    assert record["verdicts"] == [line]
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=30_000)


def test_start_anyway_is_not_offered_beside_another_verdict(qtbot, make_studio, tmp_path):
    studio = make_studio(fake_command("normal"), sampler=TINY_GPU)
    qtbot.waitUntil(lambda: studio.estimate.limit_bytes == 64 << 20 and blocked(studio), timeout=10_000)
    studio.config.set("data.path", str(tmp_path / "gone.jsonl"))
    qtbot.waitUntil(lambda: "data.path" in studio.estimate.start_blocker(), timeout=5000)
    assert not studio.train_page.start_anyway_button.isVisibleTo(studio.train_page)
    studio.controller.start(anyway=True)  # even asked directly, only the memory verdict may be overridden
    assert not studio.client.is_running() and not runs_dir().exists()


def test_a_data_file_deleted_after_it_was_chosen(qtbot, make_studio, tmp_path):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    data = tmp_path / "data.jsonl"
    shutil.copy(studio.config.config().resolved_data_path(), data)
    studio.config.set("data.path", str(data))
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)
    data.unlink()
    studio.window.start_action.trigger()
    assert not studio.client.is_running() and not runs_dir().exists()
    assert studio.state.message.startswith(f"Cannot start: data.path: {data} does not exist")
    assert blocked(studio)


def test_config_only_from_the_hub(qtbot, make_studio, monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    hub = studio.pages["model"].hub
    hub.refresh_availability()
    repo = "acme/tiny-llama"
    with FakeHub(repo, BUNDLED_MODEL) as fake:
        hub.download.endpoint = fake.endpoint
        hub.edit.setText(repo)
        hub.config_button.click()
        qtbot.waitUntil(lambda: hub.config_button.isEnabled(), timeout=30_000)
        requests = list(fake.requests)
    folder = target_folder(repo)
    assert sorted(p.name for p in folder.iterdir() if p.is_file()) == ["config.json"]
    assert all("config.json" in r for r in requests)  # nothing but config.json was asked for
    assert studio.config.get("model.path") == f"hub:{repo}"
    qtbot.waitUntil(lambda: studio.estimate.breakdown is not None and blocked(studio), timeout=5000)
    assert studio.estimate.start_blocker().startswith(f"model.path: no weight files in {folder}")
    assert "config.json is in" in hub.note.text()


def test_config_only_offline_says_why(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    hub = studio.pages["model"].hub
    assert not hub.config_button.isEnabled() and hub.config_button.toolTip().startswith("offline: HF_HUB_OFFLINE")


def test_the_full_download_reuses_the_fetched_config(qtbot, make_studio, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    hub = studio.pages["model"].hub
    hub.refresh_availability()
    repo = "acme/tiny-llama"
    with FakeHub(repo, BUNDLED_MODEL) as fake:
        hub.download.endpoint = fake.endpoint
        hub.edit.setText(repo)
        hub.config_button.click()
        qtbot.waitUntil(lambda: hub.config_button.isEnabled(), timeout=30_000)
        hub.button.click()
        qtbot.waitUntil(lambda: not hub.download.is_running() and hub.button.text() == "Download", timeout=60_000)
        config_gets = [r for r in fake.requests if r.startswith("GET ") and r.endswith("/config.json")]
    assert len(config_gets) == 1, fake.requests  # fetched once: the download found it in its folder
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)  # the weights are here now
