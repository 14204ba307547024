"""The two real datasets from another project load as they are, by their entries in the project's own
dataset_info.json (or, without it, with their format detected), and fine-tune the bundled model;
its preference entry is refused for SFT.

The files are LLaMA-Factory's `data/` demo files, kept byte for byte in tests/fixtures/peer-data
(its README.md says where they come from); their SHA-256 sums below pin those bytes."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from backend.core.errors import JobError
from backend.core.data.examples import DatasetReader
from backend.core.data.records import detect_format, read_records, to_conversation
from tests.conftest import ROOT

PEER = ROOT / "tests" / "fixtures" / "peer-data"
CASES = [("alpaca_en_demo.json", "alpaca", 999), ("glaive_toolcall_en_demo.json", "sharegpt", 300)]
SHA256 = {"alpaca_en_demo.json": "bcc37c64db1a739a0789a1b81f251146fcf4459f903474bc9e3c21bbb5628318",
          "glaive_toolcall_en_demo.json": "8b84773e44e71881f32490080350734cad3069dc227eafd771ccfb80732f6437",
          "dataset_info.json": "17162e129cbfede1ef7e955dbb7819146b78cd8809fa4f39dff4f9e61308c50f",
          "mllm_demo.json": "0732db8e2351bc22233268e2956bed1f66c75343c27bdc08b80b2a47e12c7f24",
          "mllm_demo_data/1.jpg": "95d292cbe8e7151b277f8c04f670a1bd28bbb36882ed5ac0a486b6e5f6e67a0b",
          "mllm_demo_data/2.jpg": "0e64ce34dc2bf99fb5083859c57bcee674b8bfece62e7d8425a87f986b3c074f",
          "mllm_demo_data/3.jpg": "e4b1c7c2626bfe475c20fb8163d3644186e10db9530877ff72c0230f31f90aaf"}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_fixture_copy_is_unchanged(name):
    """The copy must stay the peer project's bytes, or the test stops proving anything about them."""
    data = (PEER / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256[name]


@pytest.mark.parametrize("name, fmt, count", CASES)
def test_reads_every_record(name, fmt, count):
    records = read_records(PEER / name)
    assert len(records) == count and detect_format(records, PEER / name) == fmt
    conversations = [to_conversation(r, fmt, name) for r in records]
    assert all(any(m["role"] == "assistant" for m in c) for c in conversations)
    if fmt == "sharegpt":  # tool calls and their results keep their place in the conversation
        roles = {m["role"] for c in conversations for m in c}
        assert {"system", "user", "assistant", "tool"} <= roles


@pytest.mark.parametrize("name, fmt, count", CASES)
def test_dataset_info_entry_is_honoured_and_agrees_with_detection(tmp_path, name, fmt, count):
    """Beside its dataset_info.json the file loads by its entry; alone (a copy) by detection: same conversations."""
    by_entry = DatasetReader(PEER / name)
    assert by_entry.format == f"{fmt} (dataset_info.json: {name[:-5]})"
    shutil.copy(PEER / name, tmp_path / name)
    detected = DatasetReader(tmp_path / name)
    assert detected.format == fmt
    assert [e.messages for e in by_entry.examples()] == [e.messages for e in detected.examples()]
    assert len(by_entry.examples()) == count


def test_the_preference_entry_is_refused_naming_it(tmp_path):
    shutil.copy(PEER / "dataset_info.json", tmp_path / "dataset_info.json")
    turn = {"from": "human", "value": "Hi"}  # one record of dpo_en_demo.json's shape
    (tmp_path / "dpo_en_demo.json").write_text(json.dumps([{"conversations": [turn], "chosen": {
        "from": "gpt", "value": "Hello!"}, "rejected": {"from": "gpt", "value": "Go away."}}]))
    with pytest.raises(JobError) as caught:
        DatasetReader(tmp_path / "dpo_en_demo.json")
    message = caught.value.message
    assert "entry 'dpo_en_demo'" in message and "preference data" in message and "\n" not in message


@pytest.mark.parametrize("name, fmt, count", CASES)
def test_fine_tunes_the_bundled_model(bundled_model, tmp_path, name, fmt, count):
    from tests.backend.test_techniques import run_steps

    losses, finished = run_steps(tmp_path, [f"data.path={PEER / name}", "data.max_examples=64",
                                            "train.seq_len=256"])
    assert finished["type"] == "JobFinished" and len(losses) == 3


def test_tool_call_conversation_is_masked_to_the_assistant(bundled_model):
    from transformers import AutoTokenizer

    from backend.training.tokenized import IGNORE, encode_conversation

    tokenizer = AutoTokenizer.from_pretrained(bundled_model)
    record = read_records(PEER / "glaive_toolcall_en_demo.json")[0]
    messages = to_conversation(record, "sharegpt", "glaive")
    ids, labels = encode_conversation(tokenizer, messages)
    trained = tokenizer.decode([i for i, label in zip(ids, labels) if label != IGNORE])
    for message in messages:
        if message["role"] == "assistant":
            assert message["content"][:30] in trained
        elif message["role"] in ("user", "tool"):
            assert message["content"][:30] not in trained
