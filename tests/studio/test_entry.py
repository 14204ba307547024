"""The single entry point, and the rule that the studio never loads the heavy stack."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from studio import __main__ as entry

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "accelerate")


def _fake_cli(monkeypatch, calls: list) -> None:
    module = types.ModuleType("backend.cli.app")
    module.main = lambda argv=None: calls.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "backend.cli.app", module)


@pytest.mark.parametrize("argv", [["train", "resources/presets/tiny_lora.yaml"], ["--help"],
                                  ["runs", "--json"], ["-h"]])
def test_subcommands_and_help_go_to_the_cli(monkeypatch, argv):
    calls: list = []
    _fake_cli(monkeypatch, calls)
    assert entry.main(argv) == 0
    assert calls == [argv]


def test_no_arguments_opens_the_window(monkeypatch):
    import studio.app

    opened: list = []
    monkeypatch.setattr(studio.app, "run_app", lambda argv=None: opened.append(argv) or 0)
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert entry.main([]) == 0
    assert opened == [[]]


def test_a_data_directory_that_is_a_file_is_one_line_not_a_crash(monkeypatch, capsys, tmp_path):
    import studio.app

    home = tmp_path / "home-file"
    home.write_text("not a folder")
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    monkeypatch.setattr(studio.app, "run_app", lambda argv=None: pytest.fail("the window must not be built"))
    assert entry.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"finetune-studio: FINETUNE_STUDIO_HOME={home} is a file, not a folder; point "
                   "FINETUNE_STUDIO_HOME at a folder you can write, or unset it")
    assert home.read_text() == "not a folder"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the display check is Linux-only")
def test_no_display_says_how_to_train_headless(monkeypatch, capsys):
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    assert entry.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no display" in err and "finetune-studio train resources/presets/tiny_lora.yaml" in err


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=120)


def test_studio_never_imports_the_heavy_stack(tmp_path):
    code = (
        "import sys\n"
        "import studio.app, studio.main_window, studio.__main__\n"
        "from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "s = studio.app.build_studio()\n"
        "s.window.show(); app.processEvents()\n"
        "import time; t = time.time()\n"  # the Data page reads and tokenizes in the background
        "while s.pages['data'].is_loading() and time.time() - t < 60: app.processEvents()\n"
        "assert s.pages['data'].profile and s.pages['data'].profile.lengths, 'the dataset was not read'\n"
        "for key in ('model', 'data', 'techniques', 'train', 'runs'): s.window.show_page(key); app.processEvents()\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    result = _python(code, FINETUNE_STUDIO_HOME=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "HEAVY []" in result.stdout


def test_python_m_studio_opens_and_paints(tmp_path):
    """The real entry, end to end: `python -m studio` draws its window (the startup bench's probe)."""
    result = subprocess.run([sys.executable, "-m", "studio"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen",
                                              "FINETUNE_STUDIO_STARTUP_PROBE": "1",
                                              "FINETUNE_STUDIO_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "STARTUP_PROBE" in result.stdout and "STARTUP_READY" in result.stdout


def test_worker_flag_starts_the_worker():
    """`finetune-studio --worker` (the frozen bundle's worker) answers WorkerReady."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "studio", "--worker"], input="", capture_output=True,
                          text=True, timeout=120)
    assert '"type":"WorkerReady"' in done.stdout
