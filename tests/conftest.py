"""Shared fixtures: every test gets its own studio home, so runs never touch the user's data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "resources" / "presets" / "tiny_lora.yaml"
BUNDLED_MODEL = ROOT / "resources" / "tiny"


def has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def studio_home(tmp_path_factory, monkeypatch) -> Path:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    assert (BUNDLED_MODEL / "config.json").is_file(), "resources/tiny is missing: run scripts/build_tiny_model.py"
    return BUNDLED_MODEL


@pytest.fixture(scope="session")
def thirty_step_run(tmp_path_factory, bundled_model):
    """One 30-step LoRA worker run of the demo preset in a fresh studio home, saved and evaluated at step 15
    and at the end: test_worker_e2e reads it as left, test_evaluate evaluates a copy (one run, not two).
    (folder, config, the events it streamed)."""
    from backend.cli.worker_process import WorkerProcess
    from backend.core.config.run_config import RunConfig
    from backend.core.runs.run_folder import RunFolder

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETUNE_STUDIO_HOME", str(tmp_path_factory.mktemp("thirty-home")))
        config = RunConfig.load(PRESET, ["train.max_steps=30", "train.save_steps=15", "train.eval_steps=15",
                                         "train.cpu_threads=1", "name=e2e"])
        folder = RunFolder.create(config)
        events: list[dict] = []
        terminal = WorkerProcess().run(folder, config, on_event=events.append)
    return folder, config, events, terminal


os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests reaches the Hub; the fake hub tests lift it
