"""Config mistakes on the command line: one line that names the key, where it was written, and the fix."""

from pathlib import Path

import pytest

import backend.cli.app
from backend.cli.app import main
from backend.core.config.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]
PRESET = str(ROOT / "resources/presets/tiny_lora.yaml")


@pytest.fixture(autouse=True)
def no_runs(monkeypatch):
    """A config that is unexpectedly accepted fails the test instead of starting a fine-tune."""
    def refuse(*args, **kwargs):
        raise AssertionError("the config was accepted and a run was about to start")

    monkeypatch.setattr(backend.cli.app.RunFolder, "create", refuse)


def cli_error(argv: list[str], capsys) -> str:
    """Run the CLI; it must refuse with exit code 2 and one line of stderr, which is returned. A config
    problem that also has choices this machine cannot run says those too (one `error:` line each, then
    one hint: backend.cli.checks.load_for_train)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "{'" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: "), err
    assert len(lines) == 1 or (all(line.startswith("error: ") for line in lines[:-1])
                               and lines[-1].startswith("hint: nothing was started")), err
    return lines[0]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_set_typo_suggests_the_field(capsys):
    line = cli_error(["train", PRESET, "--set", "train.max_step=5"], capsys)
    assert "--set train.max_step=5" in line and "unknown field train.max_step;" in line
    assert "did you mean train.max_steps?" in line


def test_set_typo_in_the_section(capsys):
    line = cli_error(["estimate", PRESET, "--set", "trian.max_steps=5"], capsys)
    assert "unknown section trian" in line and "did you mean train?" in line


def test_yaml_section_typo_names_file_and_line(tmp_path, capsys):
    path = write(tmp_path, "name: demo\ntrian:\n  max_steps: 3\n")
    line = cli_error(["train", path], capsys)
    assert f"{path} line 2:" in line and "unknown section trian" in line and "did you mean train?" in line


def test_yaml_field_typo_names_file_and_line(tmp_path, capsys):
    path = write(tmp_path, "train:\n  max_steps: 3\n  learning_rat: 0.001\n")
    line = cli_error(["train", path], capsys)
    assert f"{path} line 3:" in line and "unknown field train.learning_rat;" in line
    assert "did you mean train.learning_rate?" in line


def test_field_written_without_its_section_finds_it(tmp_path, capsys):
    path = write(tmp_path, "max_step: 3\n")
    assert "did you mean train.max_steps?" in cli_error(["train", path], capsys)


def test_no_close_match_points_to_the_help(tmp_path, capsys):
    path = write(tmp_path, "train:\n  zzqqxx: 1\nwibble:\n  a: 1\n")
    line = cli_error(["train", path], capsys)
    assert "unknown field train.zzqqxx" in line and "did you mean" not in line
    assert "`finetune-studio train --help`" in line
    line = cli_error(["train", PRESET, "--set", "wibble.a=1"], capsys)
    assert "unknown section wibble" in line and "did you mean" not in line
    assert "`finetune-studio train --help`" in line


def test_set_error_is_blamed_on_the_set_not_the_file(capsys):
    line = cli_error(["train", PRESET, "--set", "train.max_steps=0"], capsys)
    assert line.startswith("error: --set train.max_steps=0: field train.max_steps:")
    line = cli_error(["train", PRESET, "--set", "train.max_steps={a: 1}"], capsys)
    assert "(got a mapping)" in line


# Every check across several fields (TechniqueSection, HardwareSection, TrainSection and RunConfig validators).
CROSS_FIELD = [
    (["technique.precision=fp32", "technique.attention=flash_attention_2"], ["technique.attention", "technique.precision"]),
    (["technique.optimizer=adamw_8bit", "technique.offload=zero2_optimizer", "hardware.strategy=deepspeed_zero2"],
     ["technique.optimizer", "technique.offload"]),
    (["technique.method=lora8", "technique.offload=zero3_optimizer_params", "hardware.strategy=deepspeed_zero3"],
     ["technique.offload", "technique.method"]),
    (["hardware.num_processes=2"], ["hardware.strategy", "hardware.num_processes"]),
    (["technique.offload=zero2_optimizer"], ["technique.offload", "hardware.strategy"]),
    (["technique.offload=zero3_optimizer_params", "hardware.strategy=deepspeed_zero2"],
     ["technique.offload", "hardware.strategy"]),
    (["model.adapter=bundled:adapters/tiny-yes-no", "technique.method=full"], ["model.adapter", "technique.method full"]),
    (["technique.objective=dpo", "data.format=alpaca"], ["data.format alpaca", "technique.objective dpo"]),
    (["technique.objective=kto", "train.micro_batch_size=1"], ["technique.objective kto", "train.micro_batch_size"]),
    (["train.warmup_steps=60"], ["train.warmup_steps", "train.max_steps"]),
    (["train.max_steps=null"], ["train.max_steps", "train.num_epochs", "set one"]),
    (["train.num_epochs=2", "train.max_steps=5"], ["train.max_steps 5", "train.num_epochs 2", "set the other to null"]),
    (["train.warmup_ratio=0.1", "train.warmup_steps=3"], ["train.warmup_steps 3", "train.warmup_ratio 0.1"]),
    (["schema_version=99"], ["schema_version"]),
    (["schema_version=0"], ["schema_version 0", "schema_version: 1"]),
    (["train.max_steps=yes"], ["train.max_steps", "not a number"]),
]


@pytest.mark.parametrize("sets, fields", CROSS_FIELD, ids=[c[1][0] + "/" + c[0][-1] for c in CROSS_FIELD])
def test_cross_field_checks_name_fields_not_the_config(sets, fields, capsys):
    argv = ["train", PRESET]
    for item in sets:
        argv += ["--set", item]
    line = cli_error(argv, capsys)
    assert "Value error" not in line and "model_path" not in line and len(line) < 300, line
    for field in fields:
        assert field in line


def test_every_cross_field_check_is_covered():
    """Each case above trips a different check, one per `raise ValueError` in backend/core/config/run_config.py
    and schedule.py (the train section): a new check with no case here fails this test."""
    import inspect

    import backend.core.config.run_config
    import backend.core.config.schedule

    modules = (backend.core.config.run_config, backend.core.config.schedule)
    assert sum(inspect.getsource(m).count("raise ValueError(") for m in modules) == len(CROSS_FIELD)
    messages = set()
    for sets, _ in CROSS_FIELD:
        with pytest.raises(ConfigError) as caught:
            RunConfig.load(PRESET, sets)
        messages.add(str(caught.value).split(": ", 1)[1].split(";")[0])
    assert len(messages) == len(CROSS_FIELD)
