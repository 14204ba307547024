"""LLaMA-Factory dataset_info.json entries for preference (ranking) and KTO data, as its demos write them."""

from __future__ import annotations

import json
from pathlib import Path

from backend.core.data.preference_info import entry_mapper

DPO_ENTRY = {"file_name": "dpo_en_demo.json", "ranking": True, "formatting": "sharegpt",
             "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
KTO_ENTRY = {"file_name": "kto_en_demo.json", "formatting": "sharegpt",
             "columns": {"messages": "messages", "kto_tag": "label"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}


def write_info(folder: Path, entries: dict) -> None:
    (folder / "dataset_info.json").write_text(json.dumps(entries), encoding="utf-8")


def test_sharegpt_ranking_as_in_dpo_en_demo(tmp_path):
    write_info(tmp_path, {"dpo_en_demo": DPO_ENTRY})
    label, convert = entry_mapper(tmp_path / "dpo_en_demo.json")
    assert label == "sharegpt ranking (dataset_info.json: dpo_en_demo)"
    record = {"conversations": [{"from": "human", "value": "Hi?"}], "chosen": {"from": "gpt", "value": "Hello."},
              "rejected": {"from": "gpt", "value": "Go away."}}
    assert convert(record) == {"prompt": [{"role": "user", "content": "Hi?"}],
                               "chosen": [{"role": "assistant", "content": "Hello."}],
                               "rejected": [{"role": "assistant", "content": "Go away."}]}


def test_sharegpt_kto_as_in_kto_en_demo(tmp_path):
    write_info(tmp_path, {"kto_en_demo": KTO_ENTRY})
    label, convert = entry_mapper(tmp_path / "kto_en_demo.json")
    assert label == "sharegpt kto (dataset_info.json: kto_en_demo)"
    record = {"messages": [{"role": "user", "content": "Sum up?"}, {"role": "assistant", "content": "Short."}],
              "label": True}
    assert convert(record) == record


def test_alpaca_ranking_joins_instruction_and_input_with_defaults(tmp_path):
    write_info(tmp_path, {"pairs": {"file_name": "pairs.json", "ranking": True}})
    _, convert = entry_mapper(tmp_path / "pairs.json")
    record = {"instruction": "Translate", "input": "chat", "chosen": "cat", "rejected": "dog"}
    assert convert(record)["prompt"] == [{"role": "user", "content": "Translate\nchat"}]
    assert convert(record)["chosen"] == [{"role": "assistant", "content": "cat"}]


def test_alpaca_kto_reads_only_the_named_columns(tmp_path):
    write_info(tmp_path, {"kto_alpaca": {"file_name": "k.jsonl", "columns": {
        "prompt": "prompt", "response": "completion", "kto_tag": "label"}}})
    _, convert = entry_mapper(tmp_path / "k.jsonl")
    record = {"prompt": "Q", "input": "not read", "completion": "A", "label": False}
    assert convert(record) == {"prompt": [{"role": "user", "content": "Q"}],
                               "completion": [{"role": "assistant", "content": "A"}], "label": False}


def test_an_sft_entry_or_no_entry_gives_none(tmp_path):
    write_info(tmp_path, {"sft": {"file_name": "sft.json"}})
    assert entry_mapper(tmp_path / "sft.json") is None
    assert entry_mapper(tmp_path / "other.json") is None


def test_the_readers_follow_the_entry_renamed_columns_included(tmp_path):
    from backend.core.data.preference_shapes import read_pairs, read_unpaired

    write_info(tmp_path, {
        "pairs": {"file_name": "pairs.jsonl", "ranking": True, "columns": {
            "prompt": "question", "chosen": "good", "rejected": "bad"}},
        "feedback": KTO_ENTRY | {"file_name": "feedback.jsonl"}})
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"question": "Q?", "good": "yes", "bad": "no"}) + "\n")
    (tmp_path / "feedback.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "yes"}], "label": True},
        {"messages": [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "no"}], "label": False},
    ]) + "\n")
    [pair] = read_pairs(tmp_path / "pairs.jsonl")
    assert pair["chosen"] == [{"role": "assistant", "content": "yes"}]
    examples, unpaired = read_unpaired(tmp_path / "feedback.jsonl")
    assert [e["label"] for e in examples] == [True, False] and unpaired == 0


def test_a_kto_record_that_ends_on_the_user_is_refused_with_its_line(tmp_path):
    import pytest

    from backend.core.errors import JobError
    from backend.core.data.preference_shapes import read_unpaired

    write_info(tmp_path, {"feedback": KTO_ENTRY | {"file_name": "feedback.jsonl"}})
    (tmp_path / "feedback.jsonl").write_text(json.dumps(
        {"messages": [{"role": "user", "content": "Q?"}], "label": True}) + "\n")
    with pytest.raises(JobError) as caught:
        read_unpaired(tmp_path / "feedback.jsonl")
    assert "feedback.jsonl line 1" in caught.value.message and "assistant" in caught.value.message


def test_the_data_page_preview_reads_what_the_trainer_reads(tmp_path):
    from backend.core.data.objective_records import read_objective_records

    write_info(tmp_path, {"dpo_en_demo": DPO_ENTRY})
    record = {"conversations": [{"from": "human", "value": "Hi?"}], "chosen": {"from": "gpt", "value": "Hello."},
              "rejected": {"from": "gpt", "value": "Go away."}}
    (tmp_path / "dpo_en_demo.json").write_text(json.dumps([record, record]), encoding="utf-8")
    seen = read_objective_records(str(tmp_path / "dpo_en_demo.json"), "dpo")
    assert seen.problem == "" and seen.count == 2 and seen.columns == ("prompt", "chosen", "rejected")
    assert seen.rows[0]["chosen"] == "Hello." and "Hi?" in seen.rows[0]["prompt"]
    kto = read_objective_records(str(tmp_path / "dpo_en_demo.json"), "kto")  # pairs unpaired, as KTO trains them
    assert kto.problem == "" and [row["label"] for row in kto.rows] == ["true", "false", "true", "false"]
