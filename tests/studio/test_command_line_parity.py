"""The window's command line is a real CLI line: it parses, and it runs exactly the window's config."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from backend.cli.app import build_parser
from backend.core.config.run_config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "resources" / "presets" / "tiny_lora.yaml"


def cli_config(line: str) -> RunConfig:
    """What `finetune-studio train ...` would run for this line (parsed as the shell and the CLI do)."""
    argv = shlex.split(line)
    assert argv[:2] == ["finetune-studio", "train"]
    args = build_parser().parse_args(argv[1:])
    return RunConfig.load(args.config, args.set)


def assert_same_run(studio) -> None:
    line = studio.pages["techniques"].command_line.text()
    assert cli_config(line).model_dump() == studio.config.config().model_dump(), line


def test_default_preset_line_parses_and_matches(qtbot, make_studio):
    studio = make_studio()
    assert studio.pages["techniques"].command_line.text() == "finetune-studio train resources/presets/tiny_lora.yaml"
    assert_same_run(studio)


def test_a_remembered_model_is_on_the_line(qtbot, make_studio, bundled_model):
    from studio.services.settings import Settings

    Settings().last_model = str(bundled_model)
    studio = make_studio()
    assert studio.config.config().model.path == str(bundled_model)
    assert f"--set model.path={bundled_model}" in studio.pages["techniques"].command_line.text()
    assert_same_run(studio)


@pytest.fixture
def warmup_preset(tmp_path: Path) -> Path:
    """The bundled preset with a real preset's warmup (20 steps, as the hub presets have)."""
    raw = yaml.safe_load(PRESET.read_text(encoding="utf-8"))
    raw["train"]["warmup_steps"] = 20
    path = tmp_path / "warm.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def test_a_short_run_drops_the_file_warmup_on_the_line_too(qtbot, make_studio, warmup_preset):
    studio = make_studio()
    studio.pages["model"].use_preset(warmup_preset)
    page = studio.pages["techniques"]
    for steps in (20, 10, 1):  # the preset's warmup outlasts (or equals) the run
        page.editor("train.max_steps").setValue(steps)
        assert studio.config.problem() == ""
        assert studio.config.config().train.warmup_steps == 0
        line = page.command_line.text()
        assert f"--set train.max_steps={steps}" in line and "--set train.warmup_steps=0" in line
        assert "this run has no warmup" in page.command_line.line_edit.toolTip()
        assert_same_run(studio)
    page.editor("train.max_steps").setValue(21)  # long enough again: the preset's warmup is back
    assert studio.config.config().train.warmup_steps == 20
    assert "warmup_steps" not in page.command_line.text()
    assert "warmup" not in page.command_line.line_edit.toolTip()
    assert_same_run(studio)


def test_a_typed_warmup_that_outlasts_the_run_is_refused_by_both(qtbot, make_studio):
    studio = make_studio()
    page = studio.pages["techniques"]
    page.editor("train.max_steps").setValue(30)
    page.editor("train.warmup_steps").setValue(30)
    problem = studio.config.problem()
    assert "train.warmup_steps 30 must be below train.max_steps 30" in problem
    with pytest.raises(ConfigError) as caught:
        cli_config(page.command_line.text())
    assert str(caught.value).split(": ", 1)[1] == problem  # the CLI names its source; the window is the form
    page.editor("train.warmup_steps").setValue(29)
    assert studio.config.problem() == "" and studio.config.config().train.warmup_steps == 29
    assert_same_run(studio)


@pytest.mark.parametrize("name", ["123", "off", "null", "1e-3", "a #b", "it's: here", "[x]"])
def test_strings_that_look_like_other_yaml_round_trip(qtbot, name):
    from studio.state.config_state import ConfigState

    state = ConfigState(RunConfig.load(PRESET).model_dump(mode="json"), source=PRESET)
    state.set("name", name)
    state.set("data.path", f"/data/{name}.jsonl")
    assert cli_config(state.command_line()).model_dump() == state.config().model_dump()
