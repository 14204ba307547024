"""A table of valid and invalid config files: each invalid one names its field."""

from pathlib import Path

import pytest

from backend.core.config.run_config import ConfigError, RunConfig, apply_overrides

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


VALID = [
    ("name: x\n", {}),
    ("train:\n  max_steps: 3\n", {"train.max_steps": 3}),
    ("technique:\n  lora_rank: 16\n  lora_targets: q_proj,v_proj\n", {"technique.lora_rank": 16}),
    ("data:\n  path: /x.jsonl\n  format: sharegpt\n", {"data.format": "sharegpt"}),
    ("train:\n  learning_rate: 1e-4\n", {"train.learning_rate": 1e-4}),
]


@pytest.mark.parametrize("text, expect", VALID)
def test_valid_files_load(tmp_path, text, expect):
    config = RunConfig.load(write(tmp_path, text))
    for dotted, value in expect.items():
        section, field = dotted.split(".")
        assert getattr(getattr(config, section), field) == value


INVALID = [
    ("train:\n  max_stepz: 3\n", "unknown field train.max_stepz"),
    ("trian:\n  max_steps: 3\n", "line 1: unknown section trian; did you mean train"),
    ("train:\n  max_steps: ten\n", "field train.max_steps"),
    ("train:\n  max_steps: 0\n", "field train.max_steps"),
    ("train:\n  learning_rate: -0.1\n", "field train.learning_rate"),
    ("technique:\n  method: magic\n", "field technique.method"),
    ("data:\n  format: csvv\n", "field data.format"),
    ("train:\n  max_steps: [1\n", r"line \d+: not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    ("schema_version: 99\n", "newer than this studio"),
    ("schema_version: 0\n", "schema_version 0 is not a version of this file; this studio reads 1"),
    ("", "the file is empty"),
    ("# only a comment\n", "the file is empty"),
    ("train:\n  max_steps: on\n", "line 2: field train.max_steps: true is a yes/no value"),
    ("train:\n  max_steps: 3\n  max_steps: 4\n", "line 3: key train.max_steps is given twice \\(first on line 2\\)"),
    ("train:\n  warmup_steps: 10\n  max_steps: 5\n", "train.warmup_steps 10 must be below train.max_steps 5"),
]


@pytest.mark.parametrize("text, match", INVALID)
def test_invalid_files_name_the_field(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.load(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        RunConfig.load(tmp_path / "nope.yaml")


def test_yaml_round_trip(tmp_path):
    config = RunConfig.load(ROOT / "resources/presets/tiny_lora.yaml", ["train.max_steps=7", "name=round"])
    path = tmp_path / "out.yaml"
    config.save(path)
    assert RunConfig.load(path) == config
    assert config.train.max_steps == 7 and config.name == "round"


def test_overrides_parse_yaml_scalars():
    raw: dict = {}
    apply_overrides(raw, ["train.max_steps=5", "train.learning_rate=1e-3", "model.trust_remote_code=true"])
    assert raw == {"train": {"max_steps": 5, "learning_rate": 1e-3}, "model": {"trust_remote_code": True}}
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        apply_overrides(raw, ["train.max_steps"])


def test_field_docs_exist_for_tooltips():
    for section in ("model", "data", "technique", "train", "export", "hardware"):
        fields = RunConfig.model_fields[section].annotation.model_fields
        for name, info in fields.items():
            assert info.description, f"{section}.{name} has no docstring (it is the GUI tooltip)"


def test_defaults_are_the_logging_every_step():
    assert RunConfig().train.logging_steps == 1


def test_a_quoted_override_stays_a_string():
    """The window quotes a string that would read back as a number; the CLI must keep it a string."""
    config = RunConfig.load(ROOT / "resources/presets/tiny_lora.yaml", ["name='123'", "data.path='/d/1e-3'"])
    assert config.name == "123" and config.data.path == "/d/1e-3"
    raw: dict = {}
    apply_overrides(raw, ["train.learning_rate=1e-3", "name=1e-3"])
    assert raw == {"train": {"learning_rate": 1e-3}, "name": 1e-3}  # unquoted: YAML 1.1's missed floats
