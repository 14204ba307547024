"""Every bad input is one line naming the file, line or field and the fix; never a traceback.

The fixtures live in tests/fixtures/bad_inputs/, one per case.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.errors import JobError
from tests.conftest import PRESET, ROOT

BAD = Path(__file__).resolve().parents[1] / "fixtures" / "bad_inputs"


@pytest.fixture(scope="module")
def tokenizer(bundled_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_model)


def data_error(tokenizer, name: str, *overrides: str) -> JobError:
    from backend.training.tokenized import build_datasets

    config = RunConfig.load(PRESET, [f"data.path={BAD / name}", *overrides])
    with pytest.raises(JobError) as caught:
        build_datasets(config, tokenizer)
    assert caught.value.kind == "bad_input"
    assert "\n" not in caught.value.message
    return caught.value


DATA_CASES = [
    ("not_json.jsonl", [], "not_json.jsonl line 3: not valid JSON"),
    ("missing_fields.jsonl", [], "missing_fields.jsonl: 1 of 5 examples has no 'output' field (first: line 5); "
                                 "fix them or set data.skip_invalid: true"),
    ("empty.jsonl", [], "empty.jsonl: the dataset is empty"),
    ("not_utf8.jsonl", [], "not_utf8.jsonl line 2: not UTF-8 text"),
    ("binary.jsonl", [], "binary.jsonl: looks like a binary file"),
    ("nothing_readable", [], "nothing_readable: the folder holds nothing readable"),
    ("unknown_format.jsonl", [], "cannot tell the format from the fields ['answer', 'question']"),
    ("too_long.jsonl", ["data.truncate=false", "train.seq_len=64"], "too_long.jsonl line 2:"),
    ("does_not_exist.jsonl", [], "does_not_exist.jsonl: dataset file not found"),
]


@pytest.mark.parametrize("name, overrides, message", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_dataset(tokenizer, name, overrides, message):
    error = data_error(tokenizer, name, *overrides)
    assert message in error.message


def test_too_long_is_refused_with_the_fix(tokenizer):
    error = data_error(tokenizer, "too_long.jsonl", "data.truncate=false", "train.seq_len=64")
    assert "longer than train.seq_len=64" in error.message and "data.truncate" in error.hint


def test_too_long_is_truncated_and_counted(tokenizer):
    from backend.training.tokenized import build_datasets

    config = RunConfig.load(PRESET, [f"data.path={BAD / 'too_long.jsonl'}", "train.seq_len=64",
                                     "data.validation_split=0"])
    train, _, stats = build_datasets(config, tokenizer)
    assert stats.truncated == 1 and len(train) == 2
    assert max(len(row) for row in train["input_ids"]) == 64


MODEL_CASES = [
    ("missing_model", [], "does not exist", "bundled:tiny"),
    ("model_no_tokenizer", [], "has no tokenizer files", ""),
    ("model_pickle_only", [], "has only pickle weights", "allow_pickle"),
    ("model_remote_code", [], "needs code shipped with the model", "trust_remote_code"),
    ("model_bad_config", [], "config.json: not valid JSON", ""),
]


@pytest.mark.parametrize("name, overrides, message, hint", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_bad_model_folder(name, overrides, message, hint):
    from backend.training.model.loading import check_model_folder

    config = RunConfig.load(PRESET, [f"model.path={BAD / name}", *overrides])
    with pytest.raises(JobError) as caught:
        check_model_folder(config)
    assert message in caught.value.message and hint in caught.value.hint
    assert "\n" not in caught.value.message


def test_pickle_and_remote_code_pass_the_check_once_ticked():
    from backend.training.model.loading import check_model_folder

    check_model_folder(RunConfig.load(PRESET, [f"model.path={BAD / 'model_pickle_only'}", "model.allow_pickle=true"]))
    check_model_folder(RunConfig.load(PRESET, [f"model.path={BAD / 'model_remote_code'}", "model.trust_remote_code=true"]))


CONFIG_CASES = [
    ("typo.yaml", "unknown field train.max_stpes"),
    ("wrong_type.yaml", "field train.micro_batch_size"),
    ("negative_lr.yaml", "field train.learning_rate: Input should be greater than 0"),
    ("zero_steps.yaml", "field train.max_steps: Input should be greater than or equal to 1"),
    ("bad_method.yaml", "field technique.method"),
]


@pytest.mark.parametrize("name, message", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(name, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig.load(BAD / name)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert name in str(caught.value)


def test_lora_rank_larger_than_the_layer(bundled_model, tmp_path):
    from tests.backend.test_techniques import run_steps

    with pytest.raises(JobError, match="technique.lora_rank 1024 is larger than the smallest adapted layer"):
        run_steps(tmp_path, ["technique.lora_rank=1024"])


def test_through_the_real_worker_the_user_sees_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "studio", "train", str(PRESET), "--set", f"data.path={BAD / 'not_json.jsonl'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2  # bad input, found by the worker
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {BAD / 'not_json.jsonl'} line 3: not valid JSON (Expecting value at column 37)"]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
