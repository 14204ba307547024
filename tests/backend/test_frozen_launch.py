"""A frozen (PyInstaller) bundle has no `python -c`: every process the studio or the CLI starts is
`<bundle> ...`, and the bundle's entry turns it back into the module it names."""

from __future__ import annotations

import importlib.util
import sys

from backend.runtime.processes import ISOLATED, module_command, worker_command
from tests.conftest import ROOT

BUNDLE = "/opt/finetune-studio/finetune-studio"


def _entry():
    spec = importlib.util.spec_from_file_location(
        "finetune_studio_entry", ROOT / "packaging" / "pyinstaller" / "finetune_studio_entry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_in_a_bundle_every_module_is_started_with_dash_m_which_its_entry_runs(monkeypatch, tmp_path):
    assert module_command("backend.serving.tf_server")[1:] == ["-c", ISOLATED, "backend.serving.tf_server"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", BUNDLE)
    assert module_command("backend.serving.tf_server") == [BUNDLE, "-m", "backend.serving.tf_server"]
    assert module_command("accelerate.commands.launch")[1:2] == ["-m"]  # multi-GPU: accelerate launch, the same way
    assert worker_command() == [BUNDLE, "--worker"]
    (tmp_path / "frozen_probe.py").write_text(
        "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text(' '.join(sys.argv[2:]))\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "argv.txt"
    monkeypatch.setattr(sys, "argv", [BUNDLE, *module_command("frozen_probe")[1:], str(out), "--port", "8000"])
    assert _entry().main() == 0
    assert out.read_text(encoding="utf-8") == "--port 8000"  # the module ran with its own arguments


def test_the_served_command_line_reads_the_same_frozen_or_not(monkeypatch, bundled_model):
    from backend.serving.engines import transformers_launch
    from backend.serving.source import resolve

    source = resolve(str(bundled_model), None)
    plain = transformers_launch(source, 8000, "fs-token", "cpu")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", BUNDLE)
    frozen = transformers_launch(source, 8000, "fs-token", "cpu")
    assert frozen.argv[:3] == [BUNDLE, "-m", "backend.serving.tf_server"]
    assert frozen.shown == plain.shown and frozen.shown.startswith(f"transformers serve {bundled_model}")
