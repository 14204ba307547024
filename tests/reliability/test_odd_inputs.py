"""Odd inputs from a CLI fuzz that once hung or spoke in raw library errors: each now ends in one line.

A config file of many megabytes, one example of many megabytes, a model config.json without a
dimension its family needs, and a disk that fills while safetensors writes a checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import backend.cli
import backend.worker_process
from backend.cli import main
from backend.config import RunConfig
from backend.errors import JobError
from backend.runs import RunFolder
from tests.conftest import BUNDLED_MODEL, PRESET
from tests.reliability.test_bad_inputs_cli import RefusedWorker, one_line


@pytest.fixture
def no_worker(monkeypatch):
    """A bad input must be refused before a worker starts or a run folder is made."""
    for module in (backend.cli, backend.worker_process):
        monkeypatch.setattr(module, "WorkerProcess", RefusedWorker)
    monkeypatch.setattr(RunFolder, "create", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
        AssertionError("a bad input was accepted and a run folder was about to be made"))))


# --- a config file of 52 MB ----------------------------------------------------------------------

def test_a_huge_config_file_is_refused_unread(tmp_path, capsys, no_worker, monkeypatch):
    import backend.config

    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:  # valid YAML all through: only its size is wrong
        handle.write("train:\n  max_steps: 3\n")
        handle.write("# padding\n" * 5_200_000)
    parse = backend.config.parse_config_yaml

    def parse_unless_huge(text, source):
        assert "huge.yaml" not in str(source), "the huge file was parsed"
        return parse(text, source)

    monkeypatch.setattr(backend.config, "parse_config_yaml", parse_unless_huge)
    began = time.monotonic()
    code = main(["train", str(path)])
    line = one_line(*capsys.readouterr())
    assert code == 2 and time.monotonic() - began < 5
    assert str(path) in line and "52.0 MB" in line and "too big to be a config file" in line, line


def test_a_config_just_under_the_limit_still_loads(tmp_path):
    from backend.config_file import MAX_CONFIG_BYTES

    path = tmp_path / "padded.yaml"
    head = "train:\n  max_steps: 3\n"
    path.write_text(head + "#" * (MAX_CONFIG_BYTES - len(head) - 1) + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert RunConfig.load(path).train.max_steps == 3
