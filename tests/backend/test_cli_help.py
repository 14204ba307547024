"""`train --help` and `estimate --help` list every config field, from the models themselves."""

import pytest

from backend.cli.app import main
from backend.core.config.run_config import RunConfig, field_paths, section_models
from backend.core.config.help import fields_epilog


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def every_field():
    sections = section_models()
    for name, info in RunConfig.model_fields.items():
        if name in sections:
            for field, sub in sections[name].model_fields.items():
                yield f"{name}.{field}", sub
        else:
            yield name, info


@pytest.mark.parametrize("command", ["train", "estimate"])
def test_help_lists_every_field_with_its_description(command, capsys):
    text = help_text(command, capsys)
    flat = " ".join(text.split())  # wrapped lines read as one
    fields = list(every_field())
    assert len(fields) > 40  # the walk itself found the sections
    for path, info in fields:
        first_words = " ".join(info.description.split()[:6])
        assert f" {path} (" in flat, f"{path} is missing from `{command} --help`"
        assert first_words in flat, f"{path}'s description is missing from `{command} --help`"


def test_help_shows_type_default_and_section_groups(capsys):
    text = help_text("train", capsys)
    assert "  train.max_steps  (int >= 1 or null, default 60)  Optimizer steps to run; null when" in text
    assert "train.lr_scheduler  (linear|cosine|constant_with_warmup, default linear)" in text
    assert "train.warmup_ratio  (float in [0, 1), default 0.0)" in text
    assert "train.max_grad_norm  (float >= 0, default 1.0)" in text
    assert "technique.method  (lora|dora|qlora|lora8|full, default lora)" in text
    assert "(float > 0 or null, default null)" in text  # technique.neftune_alpha
    assert "(list of adapter, default [adapter])" in text
    for section in section_models():
        assert f"\n{section}:\n" in text
    # in file order: a field sits under its own section's title
    assert text.index("\ntrain:\n") < text.index("  train.max_steps  (") < text.index("\nexport:\n")


@pytest.mark.parametrize("width", [78, 98])
def test_epilog_fits_the_terminal(width):
    lines = fields_epilog(width).splitlines()
    assert max(len(line) for line in lines) <= width
    assert all(path in fields_epilog(width) for path in field_paths())


def test_a_new_field_shows_up_by_itself(monkeypatch):
    """The help is generated: a field added to a model is listed with no other change."""
    from pydantic import Field, create_model

    from backend.core.config.run_config import TrainSection

    Extra = create_model("Extra", __base__=TrainSection,
                         brand_new=(int, Field(default=3, ge=0, description="A field nobody listed.")))
    monkeypatch.setitem(RunConfig.model_fields, "train", RunConfig.model_fields["train"].__class__(
        annotation=Extra, default_factory=Extra))
    text = fields_epilog(98)
    assert "train.brand_new  (int >= 0, default 3)  A field nobody listed." in text
