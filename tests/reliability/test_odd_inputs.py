"""Odd inputs from a CLI fuzz that once hung or spoke in raw library errors: each now ends in one line.

A config file of many megabytes, one example of many megabytes, a model config.json without a
dimension its family needs, and a disk that fills while safetensors writes a checkpoint.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import backend.cli.app
import backend.cli.worker_process
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.core.runs.run_folder import RunFolder
from tests.conftest import BUNDLED_MODEL, PRESET
from tests.reliability.test_bad_inputs_cli import RefusedWorker, one_line


@pytest.fixture
def no_worker(monkeypatch):
    """A bad input must be refused before a worker starts or a run folder is made."""
    for module in (backend.cli.app, backend.cli.worker_process):
        monkeypatch.setattr(module, "WorkerProcess", RefusedWorker)
    monkeypatch.setattr(RunFolder, "create", classmethod(lambda cls, *a, **k: (_ for _ in ()).throw(
        AssertionError("a bad input was accepted and a run folder was about to be made"))))


# --- a config file of 52 MB ----------------------------------------------------------------------

def test_a_huge_config_file_is_refused_unread(tmp_path, capsys, no_worker, monkeypatch):
    import backend.core.config.run_config

    path = tmp_path / "huge.yaml"
    with path.open("w") as handle:  # valid YAML all through: only its size is wrong
        handle.write("train:\n  max_steps: 3\n")
        handle.write("# padding\n" * 5_200_000)
    parse = backend.core.config.run_config.parse_config_yaml

    def parse_unless_huge(text, source):
        assert "huge.yaml" not in str(source), "the huge file was parsed"
        return parse(text, source)

    monkeypatch.setattr(backend.core.config.run_config, "parse_config_yaml", parse_unless_huge)
    began = time.monotonic()
    code = main(["train", str(path)])
    line = one_line(*capsys.readouterr())
    assert code == 2 and time.monotonic() - began < 5
    assert str(path) in line and "52.0 MB" in line and "too big to be a config file" in line, line


def test_a_config_just_under_the_limit_still_loads(tmp_path):
    from backend.core.config.file import MAX_CONFIG_BYTES

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
    from backend.training.model.model_check import _dimensions
    from tests.families import FAMILIES

    gpt2 = {k: v for k, v in FAMILIES["gpt2"].items() if k != "n_embd"}
    with pytest.raises(JobError) as caught:
        _dimensions(Path("config.json"), gpt2)
    assert "n_embd is missing (GPT2Config's name for hidden_size)" in caught.value.message
    _dimensions(Path("config.json"), {**gpt2, "hidden_size": 64})  # the canonical name, as transformers reads it


def test_no_released_or_family_config_is_refused_for_a_missing_dimension():
    """The published config.json of real models and every tiny family pass: what they leave out
    (GPT-2's n_inner, Mistral's head_dim) their config class derives."""
    from backend.training.model.model_check import _dimensions
    from tests import model_configs
    from tests.families import FAMILIES

    for name in model_configs.names():
        config = model_configs.load(name)
        if "text_config" not in config:  # as check_files: a multimodal config nests its sizes
            _dimensions(Path(name), config)
    for family, config in FAMILIES.items():
        _dimensions(Path(family), config)


# --- a disk that fills while safetensors writes a checkpoint -------------------------------------

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
"""SafetensorError's own words when the disk fills mid-write (safetensors.torch.save_file on a full tmpfs)."""


def test_a_full_disk_inside_safetensors_names_the_checkpoints_and_the_resume(bundled_model, tmp_path, monkeypatch):
    import peft.peft_model
    from safetensors import SafetensorError

    from backend.worker.failures import classify_failure
    from tests.reliability.test_failures import run_in_process

    real_save = peft.peft_model.safe_save_file

    def filling_save(tensors, filename, *args, **kwargs):
        if "checkpoint-8" in str(filename):
            Path(filename).write_bytes(b"\0" * 1000)  # the torn file a full disk leaves
            raise SafetensorError(FULL)
        return real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(peft.peft_model, "safe_save_file", filling_save)
    run_dir = tmp_path / "run"
    config, exc = run_in_process(run_dir, [])
    assert type(exc).__name__ == "SafetensorError", exc
    failure = classify_failure(exc, config, run_dir)
    assert failure.kind == "disk_full" and "\n" not in failure.message, failure
    checkpoints = run_dir / "checkpoints"
    assert failure.message.startswith(f"the disk is full while writing {checkpoints / 'checkpoint-8'}: "), failure
    assert "checkpoint-8 was cut short and removed" in failure.message
    assert "checkpoint-4 is intact (the newest complete checkpoint)" in failure.message
    assert "MiB free now)" in failure.message and "SafetensorError" not in failure.message
    assert failure.hint == f"free space on that disk, then start `finetune-studio train --resume {run_dir}`"
    assert [c.name for c in RunFolder(run_dir).complete_checkpoints()] == ["checkpoint-4"]
    assert not (checkpoints / "checkpoint-8").exists()


def test_a_full_disk_before_any_checkpoint_says_none_is_left(tmp_path):
    from safetensors import SafetensorError

    from backend.core.runs.run_folder import CHECKPOINT_MARKER
    from backend.worker.failures import classify_failure

    torn = tmp_path / "run" / "checkpoints" / "checkpoint-2"
    torn.mkdir(parents=True)
    (torn / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    failure = classify_failure(SafetensorError(FULL), None, tmp_path / "run")
    assert failure.kind == "disk_full"
    assert "checkpoint-2 was cut short and removed; no complete checkpoint is left" in failure.message
    assert "MiB free is needed" in failure.message and failure.hint.endswith("start the run again")
    assert not torn.exists() and not (torn / CHECKPOINT_MARKER).exists()


def test_other_rust_errors_are_not_called_a_full_disk():
    from safetensors import SafetensorError

    from backend.worker.failures import classify_failure

    failure = classify_failure(SafetensorError("Error while deserializing header: HeaderTooLarge"), None, None)
    assert failure.kind == "crashed"


# --- one answer of 50 MB -------------------------------------------------------------------------

def alpaca_file(path: Path, answer: str, before: int = 4) -> Path:
    """`before` short examples, then one whose answer is `answer` (on line before + 1)."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(before):
            handle.write(json.dumps({"instruction": f"Say {i}.", "output": str(i)}) + "\n")
        handle.write(json.dumps({"instruction": "Write a lot.", "output": answer}) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED_MODEL)


def test_a_50_mb_answer_is_cut_before_tokenizing_and_said(tokenizer, tmp_path):
    """Tokenized whole, the answer took minutes; cut to 32 characters a token of seq_len, seconds."""
    from backend.training.tokenized import build_datasets

    path = alpaca_file(tmp_path / "big.jsonl", "lorem ipsum " * 4_200_000)
    assert path.stat().st_size > 50_000_000
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0"])
    began = time.monotonic()
    train, _, stats = build_datasets(config, tokenizer)
    assert time.monotonic() - began < 30
    assert stats.examples == 5 and stats.truncated == 1 and len(train["input_ids"][4]) == 256
    [note] = stats.notes
    assert note.startswith(f"{path}: cut 1 of 5 examples with a message over 8,192 characters"), note
    assert "(first: line 5, 50,400,000 characters)" in note and "train.seq_len=256" in note, note


def test_the_cut_trains_on_the_same_tokens_as_the_whole_answer(tokenizer, tmp_path):
    from backend.training.tokenized import build_datasets, encode_conversation
    from backend.core.data.records import read_records, to_conversation

    answer = "".join(f"Word {i} of a long answer, with punctuation; and numbers {i * 7}.\n" for i in range(3000))
    path = alpaca_file(tmp_path / "long.jsonl", answer, before=0)
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0"])
    train, _, stats = build_datasets(config, tokenizer)
    assert stats.truncated == 1 and "cut 1 of 1 example" in stats.notes[0]
    ids, labels = encode_conversation(tokenizer, to_conversation(read_records(path)[0], "alpaca", str(path)))
    assert len(ids) > 20 * 256  # the whole answer, tokenized: far past seq_len
    assert train["input_ids"][0] == ids[:256] and train["labels"][0] == labels[:256]


def test_truncation_off_refuses_a_cut_example_by_its_characters(tokenizer, tmp_path):
    from backend.training.tokenized import build_datasets

    path = alpaca_file(tmp_path / "big.jsonl", "lorem ipsum " * 100_000)
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0", "data.truncate=false"])
    with pytest.raises(JobError) as caught:
        build_datasets(config, tokenizer)
    error = caught.value
    assert error.kind == "bad_input" and "\n" not in error.message
    assert error.message.startswith(f"{path} line 5: 1,200,000 characters, over "), error.message
    assert "longer than train.seq_len=256" in error.message and "data.truncate: true" in error.hint
    assert "to keep every example whole" not in error.hint  # its whole length in tokens was never counted


def test_the_cli_trains_on_a_50_mb_answer_and_says_it_was_cut(bundled_model, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = alpaca_file(tmp_path / "big.jsonl", "lorem ipsum " * 4_200_000, before=8)
    done = subprocess.run([sys.executable, "-m", "studio", "train", str(PRESET), "--set", f"data.path={path}",
                           "--set", "train.max_steps=1", "--set", "train.micro_batch_size=2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    said = done.stdout + done.stderr  # progress goes to stderr, the summary to stdout
    assert done.returncode == 0, said[-1500:]
    assert f"[data_warning] {path}: cut 1 of 9 examples" in said, said[-3000:]
    assert "(first: line 9, 50,400,000 characters)" in said and "Traceback" not in said


def test_the_data_profile_and_the_estimate_measure_a_huge_answer_as_training_cuts_it(tmp_path):
    """The Data page and the worker's memory estimate read the data through DatasetProfile: it measures
    the cut text too (tokenizing 50 MB there took minutes and gigabytes after the data was loaded)."""
    from backend.estimate.run_estimate import longest_answer
    from backend.core.data.dataset_profile import MAX_TEXT_CHARS, DatasetProfile

    path = alpaca_file(tmp_path / "big.jsonl", "lorem ipsum " * 500_000)
    profile = DatasetProfile.read(str(path), str(BUNDLED_MODEL), seq_len=256)
    assert profile.tokenizer and max(profile.lengths) < 8192 and max(profile.targets) < 8192 + 8
    assert profile.notes == (f"{path}: 1 example is over 8,192 characters, measured on its first 8,192: "
                             "the lengths shown for it are lower bounds",)
    unbounded = DatasetProfile.read(str(path), str(BUNDLED_MODEL))  # the Data page knows no seq_len
    assert f"over {MAX_TEXT_CHARS:,} characters" in unbounded.notes[0]
    config = RunConfig.load(PRESET, [f"data.path={path}", "train.seq_len=64"])
    assert longest_answer(config) < 64 * 32 + 8


def test_a_huge_prompt_is_cut_then_dropped_with_its_size_a_lower_bound(tokenizer, tmp_path):
    from backend.training.tokenized import build_datasets

    path = tmp_path / "prompt.jsonl"
    records = [{"instruction": f"Say {i}.", "output": str(i)} for i in range(4)]
    records.append({"instruction": "lorem ipsum " * 1_000_000, "output": "short"})
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0"])
    _, _, stats = build_datasets(config, tokenizer)
    cut, dropped = stats.notes
    assert "cut 1 of 5 examples" in cut and "(first: line 5, 12,000,000 characters)" in cut, cut
    assert "dropped 1 of 5 examples" in dropped and "a prompt of over " in dropped, dropped
    assert stats.examples == 4


TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 605248 vs 605136"
"""torch.save's words when the disk fills under optimizer.pt (a 5 MB tmpfs as the studio home): no errno."""


@pytest.mark.parametrize("free, kind", [(2**20, "disk_full"), (2**40, "crashed")])
def test_torch_saves_errno_less_failure_is_a_full_disk_only_when_the_disk_is_full(tmp_path, monkeypatch, free, kind):
    import shutil
    from collections import namedtuple

    import backend.worker.failures as failures
    from backend.core.runs.run_folder import CHECKPOINT_MARKER

    run_dir = tmp_path / "run"
    for step, complete in ((4, True), (6, False)):
        folder = run_dir / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"\0" * 4096)
        if complete:
            (folder / CHECKPOINT_MARKER).write_text("{}")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**41, 2**41 - free, free))
    failure = failures.classify_failure(RuntimeError(TORCH_FULL), None, run_dir)
    assert failure.kind == kind, failure
    if kind == "disk_full":
        assert "checkpoint-6 was cut short and removed; checkpoint-4 is intact" in failure.message
        assert "(1 MiB free now)" in failure.message and f"--resume {run_dir}" in failure.hint
    else:
        assert (run_dir / "checkpoints" / "checkpoint-6").exists()  # nothing removed on a guess


def test_the_token_cache_keeps_the_cut_note(tokenizer, tmp_path):
    from backend.training.tokenized import build_datasets

    path = alpaca_file(tmp_path / "long.jsonl", "lorem ipsum " * 10_000)
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0"])
    *_, first = build_datasets(config, tokenizer)
    *_, second = build_datasets(config, tokenizer)
    assert second.from_cache and second.notes == first.notes and "cut 1 of 5" in first.notes[0]
