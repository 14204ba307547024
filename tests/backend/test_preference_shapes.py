"""backend.core.data.preference_shapes: every accepted pair and labelled-answer shape comes out as TRL's
fields, and every malformed record is refused in one line naming its file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.core.errors import JobError
from backend.core.data.preference_shapes import as_trl_row, read_pairs, read_unpaired

USER = [{"role": "user", "content": "Is it?"}]
YES, NO = [{"role": "assistant", "content": "yes"}], [{"role": "assistant", "content": "no"}]
CHAT_PAIR = {"prompt": USER, "chosen": YES, "rejected": NO}
CHAT_KTO = {"prompt": USER, "completion": YES, "label": True}


def write(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def refusal(path: Path, read=read_pairs) -> JobError:
    with pytest.raises(JobError) as caught:
        read(path)
    message = caught.value.message
    assert "\n" not in message and "\n" not in (caught.value.hint or "") and caught.value.hint
    return caught.value


PAIR_SHAPES = {
    "text": ({"prompt": "Is it?", "chosen": "yes", "rejected": "no"},
             {"prompt": "Is it?", "chosen": "yes", "rejected": "no"}),
    "messages, answers as lists": (CHAT_PAIR, CHAT_PAIR),
    "messages, answers as one dict": ({"prompt": USER, "chosen": YES[0], "rejected": NO[0]}, CHAT_PAIR),
    "text prompt, message answers": ({"prompt": "Is it?", "chosen": YES[0], "rejected": NO}, CHAT_PAIR),
    "llama-factory ranking (conversations + from/value dicts)": (
        {"conversations": [{"from": "human", "value": "Is it?"}],
         "chosen": {"from": "gpt", "value": "yes"}, "rejected": {"from": "gpt", "value": "no"}}, CHAT_PAIR),
    "messages + role/content dicts": (
        {"messages": USER, "chosen": YES[0], "rejected": NO[0]}, CHAT_PAIR),
    "conversations + text answers": (
        {"conversations": [{"from": "human", "value": "Is it?"}], "chosen": "yes", "rejected": "no"}, CHAT_PAIR),
    "system turn kept": (
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Is it?"}],
         "chosen": "yes", "rejected": "no"},
        {"prompt": [{"role": "system", "content": "Be brief."}, *USER], "chosen": YES, "rejected": NO}),
}


@pytest.mark.parametrize("shape", PAIR_SHAPES)
def test_every_pair_shape_is_normalised(tmp_path, shape):
    record, expected = PAIR_SHAPES[shape]
    assert read_pairs(write(tmp_path, record)) == [expected]


KTO_SHAPES = {
    "text, bool label": ({"prompt": "Is it?", "completion": "yes", "label": True},
                         {"prompt": "Is it?", "completion": "yes", "label": True}),
    "text, string label": ({"prompt": "Is it?", "completion": "no", "label": "False"},
                           {"prompt": "Is it?", "completion": "no", "label": False}),
    "text, 0/1 label": ({"prompt": "Is it?", "completion": "yes", "label": 1},
                        {"prompt": "Is it?", "completion": "yes", "label": True}),
    "messages (TRL conversational)": (CHAT_KTO, CHAT_KTO),
    "llama-factory kto (messages + label)": ({"messages": USER + YES, "label": True}, CHAT_KTO),
    "llama-factory kto (conversations + kto_tag)": (
        {"conversations": [{"from": "human", "value": "Is it?"}, {"from": "gpt", "value": "no"}], "kto_tag": False},
        {"prompt": USER, "completion": NO, "label": False}),
}


@pytest.mark.parametrize("shape", KTO_SHAPES)
def test_every_labelled_shape_is_normalised(tmp_path, shape):
    record, expected = KTO_SHAPES[shape]
    assert read_unpaired(write(tmp_path, record)) == ([expected], 0)


def test_pairs_are_unpaired_into_a_desirable_and_an_undesirable_answer(tmp_path):
    path = write(tmp_path, {"conversations": [{"from": "human", "value": "Is it?"}], "chosen": "yes",
                            "rejected": "no"}, CHAT_KTO)
    examples, pairs = read_unpaired(path)
    assert pairs == 1
    assert examples == [CHAT_KTO, {"prompt": USER, "completion": NO, "label": False}, CHAT_KTO]


def test_text_becomes_turns_for_a_chat_model_and_messages_need_one(tmp_path):
    text = {"prompt": "Is it?", "completion": "yes", "label": True}
    assert as_trl_row(text, True, tmp_path) == CHAT_KTO
    assert as_trl_row(text, False, tmp_path) == text
    with pytest.raises(JobError, match="no chat template"):
        as_trl_row(CHAT_KTO, False, tmp_path)


PAIR_REFUSALS = {
    "no rejected": ({"prompt": "Is it?", "chosen": "yes"}, "no 'rejected'"),
    "no prompt": ({"chosen": "yes", "rejected": "no"}, "no 'prompt'"),
    "null answer": ({"prompt": "Is it?", "chosen": None, "rejected": "no"}, "'chosen' is null"),
    "empty answer": ({"prompt": "Is it?", "chosen": "yes", "rejected": " "}, "'rejected' is empty"),
    "same answers": ({"prompt": "Is it?", "chosen": "yes", "rejected": "yes"}, "the same answer"),
    "unknown role": ({"conversations": [{"from": "bot", "value": "Is it?"}], "chosen": "y", "rejected": "n"},
                     "the from 'bot'"),
    "answer from the user": ({"prompt": USER, "chosen": {"role": "user", "content": "y"}, "rejected": "n"},
                             "'chosen' holds a user message"),
    "prompt ends on the answer": ({"messages": USER + YES, "chosen": "y", "rejected": "n"},
                                  "the prompt must end on the user's turn"),
    "content not text": ({"prompt": [{"role": "user", "content": 3}], "chosen": "y", "rejected": "n"},
                         "content as int"),
    "message not a dict": ({"prompt": ["Is it?"], "chosen": "y", "rejected": "n"}, "where a message belongs"),
    "empty turns": ({"conversations": [], "chosen": "y", "rejected": "n"}, "'conversations' is empty"),
}


@pytest.mark.parametrize("case", PAIR_REFUSALS)
def test_a_malformed_pair_is_refused_in_one_line_with_file_line_and_field(tmp_path, case):
    record, words = PAIR_REFUSALS[case]
    path = write(tmp_path, {"prompt": "fine", "chosen": "yes", "rejected": "no"}, record)
    error = refusal(path)
    assert f"{path} line 2:" in error.message and words in error.message, error.message


KTO_REFUSALS = {
    "no label": ({"prompt": "Is it?", "completion": "yes"}, "no 'label'"),
    "no completion": ({"prompt": "Is it?", "label": True}, "no 'completion'"),
    "label not a label": ({"prompt": "Is it?", "completion": "yes", "label": "maybe"}, "'label' is 'maybe'"),
    "label 2": ({"prompt": "Is it?", "completion": "yes", "label": 2}, "'label' is 2"),
    "null label": ({"prompt": "Is it?", "completion": "yes", "label": None}, "'label' is null"),
    "turns without the answer": ({"messages": USER, "kto_tag": True}, "must be the assistant's answer"),
    "answer only": ({"messages": YES, "label": True}, "must be the assistant's answer"),
    "null completion": ({"prompt": "Is it?", "completion": None, "label": True}, "'completion' is null"),
}


@pytest.mark.parametrize("case", KTO_REFUSALS)
def test_a_malformed_labelled_answer_is_refused_in_one_line_with_file_line_and_field(tmp_path, case):
    record, words = KTO_REFUSALS[case]
    path = write(tmp_path, {"prompt": "fine", "completion": "yes", "label": True}, record)
    error = refusal(path, read_unpaired)
    assert f"{path} line 2:" in error.message and words in error.message, error.message


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(JobError):
        read_pairs(path)
    with pytest.raises(JobError):
        read_unpaired(path)


def test_a_csv_of_labelled_answers_reads_its_labels(tmp_path):
    path = tmp_path / "kto.csv"
    path.write_text("prompt,completion,label\nIs it?,yes,true\nIs it?,no,0\n")
    examples, _ = read_unpaired(path)
    assert [e["label"] for e in examples] == [True, False] and examples[0]["completion"] == "yes"
