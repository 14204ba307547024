"""Bundled resources from a checkout and from a wheel: `pip install .` carries them as data files."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from backend.core import paths

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_finds_resources_beside_the_packages(monkeypatch):
    monkeypatch.delenv("FINETUNE_STUDIO_RESOURCES", raising=False)
    assert paths.resources_dir() == ROOT / "resources"
    assert paths.resolve_resource("bundled:tiny") == ROOT / "resources" / "tiny"


def test_an_installed_wheel_finds_them_under_the_data_prefix(monkeypatch, tmp_path):
    monkeypatch.delenv("FINETUNE_STUDIO_RESOURCES", raising=False)
    monkeypatch.setattr(paths, "BESIDE", tmp_path / "site-packages" / "resources")  # a wheel has none there
    prefix = tmp_path / "venv"
    (prefix / paths.SHARED / "presets").mkdir(parents=True)
    monkeypatch.setattr(sysconfig, "get_path", lambda name, scheme=None: str(prefix))
    assert paths.resolve_resource("bundled:presets") == prefix / paths.SHARED / "presets"


def test_the_override_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("FINETUNE_STUDIO_RESOURCES", str(tmp_path))
    assert paths.resources_dir() == tmp_path


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                    reason="building a wheel offline needs setuptools in this environment (pip install setuptools)")
def test_the_wheel_carries_every_resource(tmp_path):
    source = tmp_path / "src"  # a copy, so that the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("backend", "studio", "resources"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("finetune_studio-*.whl"))
    shipped = {name.split("/resources/", 1)[1] for name in zipfile.ZipFile(wheel).namelist()
               if ".data/data/share/finetune-studio/resources/" in name}
    expected = {str(p.relative_to(ROOT / "resources")) for p in (ROOT / "resources").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    assert shipped == expected
