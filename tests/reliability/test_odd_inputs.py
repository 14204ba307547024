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


# --- a model config.json without a dimension -----------------------------------------------------

def model_without(tmp: Path, key: str) -> Path:
    """The bundled model's files (weights linked) with `key` left out of config.json."""
    folder = tmp / "model"
    folder.mkdir()
    for file in BUNDLED_MODEL.iterdir():
        if file.name == "config.json":
            config = json.loads(file.read_text(encoding="utf-8"))
            del config[key]
            (folder / file.name).write_text(json.dumps(config), encoding="utf-8")
        else:
            (folder / file.name).symlink_to(file)
    return folder


@pytest.mark.parametrize("key", ["hidden_size", "intermediate_size", "num_attention_heads"])
def test_train_refuses_a_config_json_without_a_dimension(key, tmp_path, capsys, no_worker):
    folder = model_without(tmp_path, key)
    code = main(["train", str(PRESET), "--set", f"model.path={folder}"])
    line = one_line(*capsys.readouterr())
    assert code == 2, line
    assert f"{folder / 'config.json'}: {key} is missing" in line and "LlamaConfig's default" in line, line


def test_the_family_name_of_a_dimension_is_read_and_said():
    """GPT-2 calls hidden_size n_embd (its config class's attribute_map): either name is read, the
    family's is named when both are missing."""
    from backend.training.model_check import _dimensions
    from tests.families import FAMILIES

    gpt2 = {k: v for k, v in FAMILIES["gpt2"].items() if k != "n_embd"}
    with pytest.raises(JobError) as caught:
        _dimensions(Path("config.json"), gpt2)
    assert "n_embd is missing (GPT2Config's name for hidden_size)" in caught.value.message
    _dimensions(Path("config.json"), {**gpt2, "hidden_size": 64})  # the canonical name, as transformers reads it


def test_no_released_or_family_config_is_refused_for_a_missing_dimension():
    """The published config.json of real models and every tiny family pass: what they leave out
    (GPT-2's n_inner, Mistral's head_dim) their config class derives."""
    from backend.training.model_check import _dimensions
    from tests import model_configs
    from tests.families import FAMILIES

    for name in model_configs.names():
        config = model_configs.load(name)
        if "text_config" not in config:  # as check_files: a multimodal config nests its sizes
            _dimensions(Path(name), config)
    for family, config in FAMILIES.items():
        _dimensions(Path(family), config)
