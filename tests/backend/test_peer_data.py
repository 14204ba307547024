"""The two real datasets from another project load as they are, with their format detected, and
fine-tune the bundled model (shared/peer-data, kept byte for byte)."""

from __future__ import annotations

import pytest

from backend.training.records import detect_format, read_records, to_conversation
from tests.conftest import ROOT

PEER = ROOT.parent / "shared" / "peer-data"
CASES = [("alpaca_en_demo.json", "alpaca", 999), ("glaive_toolcall_en_demo.json", "sharegpt", 300)]

pytestmark = pytest.mark.skipif(not PEER.is_dir(), reason="shared/peer-data is not beside the checkout")


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
def test_fine_tunes_the_bundled_model(bundled_model, tmp_path, name, fmt, count):
    from tests.backend.test_techniques import run_steps

    losses, finished = run_steps(tmp_path, [f"data.path={PEER / name}", "data.max_examples=64",
                                            "train.seq_len=256"])
    assert finished["type"] == "JobFinished" and len(losses) == 3


def test_tool_call_conversation_is_masked_to_the_assistant(bundled_model):
    from transformers import AutoTokenizer

    from backend.training.data import IGNORE, encode_conversation

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
