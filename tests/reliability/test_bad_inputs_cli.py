"""Bad inputs to the CLI, one table: each exits 2 with one line (plus at most a one-line hint) that
names what is wrong and the fix; never a traceback.

In process and with no worker: a bad input must be refused before the worker starts or a model
loads, so the worker and new run folders are replaced by ones that fail the test if used.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

import backend.cli.app
import backend.cli.eval
import backend.cli.worker_process
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder
from tests.conftest import PRESET

ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0
MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000,
         "max_position_embeddings": 512}


class RefusedWorker:
    """Stands in for WorkerProcess: a bad input that reaches it fails the test."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the input was accepted and the worker was about to start")


@pytest.fixture(autouse=True)
def no_worker(monkeypatch):
    for module in (backend.cli.app, backend.cli.eval, backend.cli.worker_process):
        monkeypatch.setattr(module, "WorkerProcess", RefusedWorker)


# --- builders: each writes what a case needs under tmp and returns a path -----------------------

def yaml_file(tmp: Path, text: str | bytes, name: str = "run.yaml") -> str:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def model_folder(tmp: Path, config: dict | str | None, name: str = "model") -> str:
    """A model folder holding only config.json (a dict, raw text, or None for no file)."""
    folder = tmp / name
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(folder)


def with_hidden(value) -> dict:
    config = dict(MODEL)
    if value is None:
        del config["hidden_size"]
    else:
        config["hidden_size"] = value
    return config


def run_folder(tmp: Path, status: str = "finished", checkpoint: bool = True, name: str = "run",
               config_text: str | None = None) -> str:
    """A run folder as training leaves it: config.yaml, events, a checkpoint (no worker involved)."""
    folder = RunFolder(tmp / name)
    folder.path.mkdir(parents=True)
    if config_text is None:
        RunConfig.load(PRESET, ["train.max_steps=4"]).save(folder.config_path)
    else:
        folder.config_path.write_text(config_text, encoding="utf-8")
    events = [{"type": "JobStarted", "run_dir": str(folder.path), "max_steps": 4}]
    events += [{"type": "MetricsLogged", "step": s, "max_steps": 4, "loss": 1.0 / s} for s in (1, 2)]
    if status == "finished":
        events.append({"type": "JobFinished", "run_dir": str(folder.path), "steps": 4})
    elif status == "stopped":
        events.append({"type": "JobFinished", "run_dir": str(folder.path), "steps": 2, "stopped": True})
    folder.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    if checkpoint:
        ckpt = folder.checkpoints_dir / "checkpoint-2"
        ckpt.mkdir(parents=True)
        (ckpt / CHECKPOINT_MARKER).write_text("{}")
    return str(folder.path)


def a_file(tmp: Path, name: str = "a_file.txt") -> str:
    path = tmp / name
    path.write_text("not a folder\n")
    return str(path)


def unreadable(tmp: Path) -> str:
    path = Path(yaml_file(tmp, "train:\n  max_steps: 3\n"))
    path.chmod(0)
    return str(path)


def alias_bomb() -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 7):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "x-anchors:\n" + "\n".join("  " + line for line in lines) + "\nname: *a6\n"


def env(name: str, value: Callable[[Path], str]) -> Callable[[Path], dict[str, str]]:
    return lambda tmp: {name: value(tmp)}


# --- the table -----------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    argv: Callable[[Path], list[str]]
    words: tuple[str, ...]
    code: int = 2
    env: Callable[[Path], dict[str, str]] | None = None
    non_root: bool = False


P = str(PRESET)
EST = ["estimate", P, "--device", "cpu", "--worst-case"]

CASES = [
    # config files
    Case("config_empty", lambda t: ["train", yaml_file(t, "")], ("run.yaml", "empty")),
    Case("config_only_comments", lambda t: ["train", yaml_file(t, "# nothing here\n\n")], ("run.yaml", "empty")),
    Case("config_top_level_list", lambda t: ["train", yaml_file(t, "- train\n- model\n")], ("mapping", "list")),
    Case("config_top_level_scalar", lambda t: ["train", yaml_file(t, "just words\n")], ("mapping", "plain text")),
    Case("config_tab_indent", lambda t: ["train", yaml_file(t, "train:\n\tmax_steps: 3\n")],
         ("run.yaml line 2", "tab", "spaces")),
    Case("config_binary", lambda t: ["train", yaml_file(t, bytes(range(256)) * 4)], ("run.yaml", "binary")),
    Case("config_nul_bytes", lambda t: ["train", yaml_file(t, b"train:\x00\x00\n  max_steps: 3\n")],
         ("run.yaml", "binary")),
    Case("config_utf16", lambda t: ["train", yaml_file(t, "train:\n  max_steps: 3\n".encode("utf-16"))],
         ("run.yaml", "UTF-8")),
    Case("config_section_twice",
         lambda t: ["train", yaml_file(t, "train:\n  max_steps: 3\nname: x\ntrain:\n  seed: 1\n")],
         ("run.yaml line 4", "train", "twice", "line 1")),
    Case("config_key_twice", lambda t: ["train", yaml_file(t, "train:\n  max_steps: 3\n  max_steps: 5\n")],
         ("run.yaml line 3", "train.max_steps", "twice")),
    Case("config_schema_zero", lambda t: ["train", yaml_file(t, "schema_version: 0\n")],
         ("run.yaml line 1", "schema_version 0", "1")),
    Case("config_schema_negative", lambda t: ["estimate", yaml_file(t, "schema_version: -3\n")],
         ("schema_version -3",)),
    Case("config_schema_words", lambda t: ["train", yaml_file(t, "schema_version: one\n")], ("field schema_version",)),
    Case("config_bool_for_int", lambda t: ["train", yaml_file(t, "train:\n  max_steps: yes\n")],
         ("run.yaml line 2", "train.max_steps", "not a number")),
    Case("config_bool_for_float", lambda t: ["train", yaml_file(t, "train:\n  learning_rate: true\n")],
         ("train.learning_rate", "not a number")),
    Case("config_bool_for_optional_int", lambda t: ["train", yaml_file(t, "data:\n  max_examples: on\n")],
         ("data.max_examples", "not a number")),
    Case("config_empty_section", lambda t: ["train", yaml_file(t, "train:\nname: x\n")],
         ("run.yaml line 1", "train", "empty")),
    Case("config_section_is_number", lambda t: ["train", yaml_file(t, "train: 5\n")],
         ("section train must hold its fields", "got 5")),
    Case("config_unicode_typo", lambda t: ["train", yaml_file(t, "träin:\n  max_steps: 3\n")],
         ("unknown section träin", "did you mean train?")),
    Case("config_alias_bomb", lambda t: ["train", yaml_file(t, alias_bomb())], ("field name", "...")),
    Case("config_nested_deeply", lambda t: ["train", yaml_file(t, "name: " + "[" * 5000 + "]" * 5000 + "\n")],
         ("run.yaml", "nested too deeply")),
    Case("config_is_a_folder", lambda t: ["train", str(t)], ("is a folder",)),
    Case("config_unreadable", lambda t: ["train", unreadable(t)], ("run.yaml", "permission"), non_root=True),
    Case("config_missing", lambda t: ["train", str(t / "nope.yaml")], ("nope.yaml", "no such config file")),
    Case("config_name_too_long", lambda t: ["train", str(t / ("x" * 300 + ".yaml"))], ("too long",)),
    Case("config_unicode_name_missing", lambda t: ["estimate", str(t / "配置-ü.yaml")],
         ("配置-ü.yaml", "no such")),
    Case("config_inside_a_file", lambda t: ["train", a_file(t) + "/run.yaml"], ("a_file.txt",)),
    # --set
    Case("set_bool_for_int", lambda t: ["train", P, "--set", "train.max_steps=yes"],
         ("--set train.max_steps=yes", "not a number")),
    Case("set_without_equals", lambda t: ["train", P, "--set", "train.max_steps"], ("expected dotted.key=value",)),
    Case("set_four_parts", lambda t: ["train", P, "--set", "a.b.c.d=1"], ("unknown section a",)),
    Case("set_below_a_field", lambda t: ["train", P, "--set", "train.max_steps.x=1"], ("max_steps", "not a section")),
    Case("set_empty_part", lambda t: ["train", P, "--set", "train..max_steps=3"], ("train..max_steps", "empty")),
    Case("set_empty_key", lambda t: ["train", P, "--set", "=3"], ("expected dotted.key=value",)),
    Case("set_section_to_number", lambda t: ["train", P, "--set", "train=3"], ("--set train=3", "section train")),
    Case("set_long_unicode_value", lambda t: ["train", P, "--set", "technique.method=" + "ø" * 500],
         ("field technique.method", "...")),
    # train and --resume
    Case("train_nothing", lambda t: ["train"], ("give a config file",)),
    Case("train_config_and_resume", lambda t: ["train", P, "--resume", run_folder(t, "stopped")], ("not both",)),
    Case("resume_finished", lambda t: ["train", "--resume", run_folder(t)], ("has finished", "--more-steps")),
    Case("resume_missing", lambda t: ["train", "--resume", str(t / "gone")], ("gone", "no such run folder")),
    Case("resume_a_file", lambda t: ["train", "--resume", a_file(t)], ("a_file.txt", "a file, not a run folder")),
    Case("resume_no_config", lambda t: ["train", "--resume", str(t)], ("no config.yaml",)),
    Case("resume_broken_config", lambda t: ["train", "--resume", run_folder(t, "stopped", config_text="train: [\n")],
         ("config.yaml line", "not valid YAML")),
    Case("resume_no_checkpoint", lambda t: ["train", "--resume", run_folder(t, "failed", checkpoint=False)],
         ("no complete checkpoint",)),
    Case("more_steps_without_resume", lambda t: ["train", P, "--more-steps", "5"], ("--more-steps", "--resume")),
    Case("more_steps_zero", lambda t: ["train", "--resume", run_folder(t), "--more-steps", "0"],
         ("--more-steps", "at least 1")),
    Case("more_steps_no_checkpoint",
         lambda t: ["train", "--resume", run_folder(t, checkpoint=False), "--more-steps", "3"],
         ("no complete checkpoint",)),
    Case("machine_rank_negative", lambda t: ["train", P, "--machine-rank", "-1"], ("--machine-rank", "at least 0")),
    Case("machine_rank_beyond_machines", lambda t: ["train", P, "--machine-rank", "2"],
         ("--machine-rank 2", "hardware.num_machines")),
    # eval, chat, export
    Case("eval_limit_zero", lambda t: ["eval", run_folder(t), "--limit", "0"], ("--limit", "at least 1")),
    Case("eval_limit_negative", lambda t: ["eval", run_folder(t), "--limit", "-5"], ("--limit", "at least 1")),
    Case("eval_limit_words", lambda t: ["eval", run_folder(t), "--limit", "ten"], ("--limit", "ten")),
    Case("eval_max_new_tokens_zero", lambda t: ["eval", run_folder(t), "--max-new-tokens", "0"], ("--max-new-tokens",)),
    Case("eval_prompts_missing", lambda t: ["eval", run_folder(t), "--prompts", str(t / "p.jsonl")],
         ("p.jsonl", "no such")),
    Case("eval_run_missing", lambda t: ["eval", str(t / "nope")], ("nope", "no such run folder")),
    Case("chat_top_p_above_one", lambda t: ["chat", run_folder(t), "hi", "--top-p", "1.5"], ("--top-p",)),
    Case("chat_negative_temperature", lambda t: ["chat", run_folder(t), "hi", "--temperature", "-1"],
         ("--temperature",)),
    Case("chat_temperature_nan", lambda t: ["chat", run_folder(t), "hi", "--temperature", "nan"],
         ("--temperature", "not a finite number")),
    Case("chat_empty_message", lambda t: ["chat", run_folder(t), "  "], ("message", "empty")),
    Case("chat_run_is_a_file", lambda t: ["chat", a_file(t), "hi"], ("a file, not a run folder",)),
    Case("export_run_missing", lambda t: ["export", str(t / "nope"), "--format", "adapter"], ("no such run folder",)),
    Case("export_bad_format", lambda t: ["export", run_folder(t), "--format", "zip"], ("--format", "zip")),
    Case("export_out_is_a_file", lambda t: ["export", run_folder(t), "--format", "adapter", "--out", a_file(t)],
         ("--out", "a file")),
    Case("unknown_command", lambda t: ["trian", P], ("trian", "train")),
    Case("no_command", lambda t: [], ("command",)),
    Case("unknown_option", lambda t: ["train", P, "--max-steps", "3"], ("--max-steps",)),
    # estimate's model folder
    Case("estimate_model_missing", lambda t: [*EST, "--set", f"model.path={t}/none"], ("model.path", "does not exist")),
    Case("estimate_no_config_json", lambda t: [*EST, "--set", f"model.path={model_folder(t, None)}"],
         ("no config.json",)),
    Case("estimate_config_not_json", lambda t: [*EST, "--set", f"model.path={model_folder(t, '{')}"],
         ("config.json", "not valid JSON")),
    Case("estimate_config_json_empty", lambda t: [*EST, "--set", f"model.path={model_folder(t, '')}"],
         ("config.json", "not valid JSON")),
    Case("estimate_config_json_list", lambda t: [*EST, "--set", f"model.path={model_folder(t, '[1, 2]')}"],
         ("config.json", "JSON object")),
    Case("estimate_hidden_missing", lambda t: [*EST, "--set", f"model.path={model_folder(t, with_hidden(None))}"],
         ("hidden_size is missing",)),
    Case("estimate_hidden_string", lambda t: [*EST, "--set", f"model.path={model_folder(t, with_hidden('big'))}"],
         ("hidden_size is 'big'",)),
    Case("estimate_hidden_negative", lambda t: [*EST, "--set", f"model.path={model_folder(t, with_hidden(-64))}"],
         ("hidden_size is -64",)),
    Case("estimate_hidden_bool", lambda t: [*EST, "--set", f"model.path={model_folder(t, with_hidden(True))}"],
         ("hidden_size is True",)),
    Case("estimate_gpus_zero", lambda t: [*EST, "--gpus", "0"], ("--gpus", "at least 1")),
    Case("estimate_gpus_negative", lambda t: [*EST, "--gpus", "-2"], ("--gpus", "at least 1")),
    Case("estimate_data_missing", lambda t: ["estimate", P, "--device", "cpu", "--set", f"data.path={t}/d.jsonl"],
         ("data.path", "d.jsonl", "--worst-case")),
    Case("estimate_hub_not_downloaded", lambda t: [*EST, "--set", "model.path=hub:nobody/nothing"],
         ("not downloaded",)),
    # the environment
    Case("home_is_a_file", lambda t: ["runs", "list"], ("FINETUNE_STUDIO_HOME", "a file"),
         env=env("FINETUNE_STUDIO_HOME", a_file)),
    Case("home_inside_a_file", lambda t: ["runs", "list"], ("FINETUNE_STUDIO_HOME", "a_file.txt"),
         env=env("FINETUNE_STUDIO_HOME", lambda t: a_file(t) + "/home")),
    Case("home_is_a_file_train", lambda t: ["train", P], ("FINETUNE_STUDIO_HOME", "a file"),
         env=env("FINETUNE_STUDIO_HOME", a_file)),
]


def one_line(out: str, err: str) -> str:
    """stdout + stderr must be one `error:` line, or that plus one `hint:` line; the error line is returned."""
    text = out + err
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert lines and lines[0].startswith("error: "), text
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), text
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line(case: Case, tmp_path, monkeypatch, capsys):
    if case.non_root and ROOT_USER:
        pytest.skip("root reads files whatever their permissions")
    monkeypatch.setattr(RunFolder, "create", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
        AssertionError("a bad input was accepted and a run folder was about to be made"))))
    argv = case.argv(tmp_path)
    for name, value in (case.env(tmp_path) if case.env else {}).items():
        monkeypatch.setenv(name, value)
    code = main(argv)
    out, err = capsys.readouterr()
    line = one_line(out, err)
    assert code == case.code, out + err
    for word in case.words:
        assert word.lower() in line.lower(), f"{word!r} not in {line!r}"
    assert len(line) < 600, line


def test_the_table_is_big_enough():
    assert len(CASES) >= 35 and len({c.id for c in CASES}) == len(CASES)
