"""Dataset files of every kind (JSON, JSONL, TXT, CSV, Parquet, Arrow, save_to_disk) read into the same
examples, with line numbers; LLaMA-Factory dataset_info.json mappings; null or empty examples refused
with their count and first line, or skipped with a note; content parts read as text."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from backend.core.errors import JobError
from backend.core.data.dataset_profile import DatasetProfile
from backend.core.data.examples import DatasetReader
from tests.conftest import ROOT

ALPACA = [{"instruction": "Say hi", "input": "", "output": "hi"},
          {"instruction": "Repeat", "input": "cat", "output": "cat cat"},
          {"instruction": "Count", "input": "", "output": "007"}]
EXPECTED = [[{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "hi"}],
            [{"role": "user", "content": "Repeat\n\ncat"}, {"role": "assistant", "content": "cat cat"}],
            [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "007"}]]


def write(path: Path, records: list[dict]) -> Path:
    """records -> a file of the kind path's suffix names (a folder without suffix: save_to_disk)."""
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    elif suffix == ".json":
        path.write_text(json.dumps(records, indent=2))
    elif suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()}
                             for r in records)
    elif suffix == ".parquet":
        import pandas as pd

        pd.DataFrame(records).to_parquet(path)
    else:
        from datasets import Dataset

        table = Dataset.from_list(records)
        if suffix == ".arrow":  # one arrow file, as save_to_disk writes its shards
            table.save_to_disk(str(path.parent / "shards"))
            (path.parent / "shards" / "data-00000-of-00001.arrow").rename(path)
        elif path.name.endswith("_dict"):  # a DatasetDict: its train split is read
            from datasets import DatasetDict

            DatasetDict({"train": table, "test": table.select([0])}).save_to_disk(str(path))
        else:
            table.save_to_disk(str(path))
    return path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def network_calls(monkeypatch) -> list:
    """Every socket connection tried (and refused) while the test runs: a library could swallow the error."""
    import datasets  # noqa: F401  (imported before the sockets close, as the worker has it)

    calls: list = []

    def refuse(sock, address, *args):
        calls.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return calls


@pytest.mark.parametrize("name", ["a.jsonl", "a.json", "a.csv", "a.parquet", "a.arrow", "saved", "saved_dict"])
def test_every_kind_reads_the_same_examples_and_writes_nothing_beside_them(tmp_path, studio_home, network_calls,
                                                                           name):
    data = tmp_path / "data"
    data.mkdir()
    path = write(data / name, ALPACA)
    before = listing(data)
    reader = DatasetReader(path)
    assert reader.format == "alpaca" and reader.total == 3
    assert [e.messages for e in reader.examples()] == EXPECTED  # "007" stays text in CSV too
    assert listing(data) == before
    assert not any((studio_home / "cache").glob("reading-*"))  # the conversion scratch folder is gone
    assert network_calls == []


def test_line_numbers_of_each_kind(tmp_path):
    """JSONL: the file line; JSON array: the line the record starts on; CSV: the row's first line
    (a quoted cell may span lines); TXT: the block's first line; Parquet: row N counted from 1."""
    null = {"instruction": "q", "input": "", "output": None}
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(json.dumps(ALPACA[0]) + "\n\n" + json.dumps(null) + "\n")
    cases = {jsonl: "line 3", write(tmp_path / "a.json", [ALPACA[0], null]): "line 7",
             write(tmp_path / "a.parquet", [ALPACA[0], null]): "row 2"}
    multi = tmp_path / "a.csv"
    multi.write_text('instruction,input,output\n"two\nlines",,ok\nq,,\n')
    cases[multi] = "line 4"
    text = tmp_path / "a.txt"
    text.write_text("first\n\n\n   \n\nsecond\n")
    for path, where in cases.items():
        with pytest.raises(JobError) as caught:
            DatasetReader(path).examples()
        assert f"1 of 2 examples has an empty or null output (first: {where})" in caught.value.message, path
    assert DatasetReader(text).where(1) == f"{text} line 6"


def test_csv_cells_stay_text_and_json_cells_are_parsed(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('instruction,input,output,history\nWhat is null in Python?,,None,\nNA,,"1,5",'
                    '"[[""hi"", ""hello""]]"\n')
    first, second = DatasetReader(path).examples()
    assert first.messages[-1]["content"] == "None" and second.messages[-3:] == [
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "NA"},
        {"role": "assistant", "content": "1,5"}]
    sharegpt = write(tmp_path / "chat.csv", [{"conversations": [{"from": "human", "value": "hi"},
                                                                 {"from": "gpt", "value": "yo"}], "system": "brief"}])
    reader = DatasetReader(sharegpt)
    assert reader.format == "sharegpt"
    assert [m["role"] for m in reader.examples()[0].messages] == ["system", "user", "assistant"]


def test_a_folder_reads_each_file_in_its_own_format(tmp_path):
    write(tmp_path / "a.jsonl", ALPACA[:2])
    write(tmp_path / "b.csv", [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]}])
    (tmp_path / "notes.md").write_text("not data")
    reader = DatasetReader(tmp_path)
    assert reader.format == "alpaca+sharegpt" and reader.total == 3
    with pytest.raises(JobError) as caught:
        reader.examples()
    message = caught.value.message
    assert "1 of 3 examples has an assistant turn with empty or null value (first: b.csv line 2)" in message


NULLS = {  # format -> (a good record, a record that would train on "None")
    "alpaca": (ALPACA[0], {"instruction": None, "input": None, "output": None}),
    "sharegpt": ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
                 {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": None}]}),
    "messages": ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
                 {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "a"}]}),
    "text": ({"text": "a document"}, {"text": "  "}),
}


@pytest.mark.parametrize("fmt", NULLS)
def test_null_or_empty_examples_are_refused_or_skipped(tmp_path, fmt):
    good, bad = NULLS[fmt]
    path = write(tmp_path / "a.jsonl", [good, bad, good, bad, good])
    with pytest.raises(JobError) as caught:
        DatasetReader(path).examples()
    message = caught.value.message
    assert message.startswith(f"{path}: 2 of 5 examples have ") and "(first: line 2)" in message
    assert message.endswith("fix them or set data.skip_invalid: true") and "\n" not in message
    reader = DatasetReader(path, skip_invalid=True)
    assert [e.index for e in reader.examples()] == [0, 2, 4] and reader.skipped == 2
    assert reader.notes[0].startswith(f"{path}: skipped 2 of 5 examples") and "line 2" in reader.notes[0]
    everything_null = write(tmp_path / "b.jsonl", [bad, bad])
    with pytest.raises(JobError, match="no example can be trained on"):
        DatasetReader(everything_null, skip_invalid=True).examples()


def test_openai_content_parts_and_tool_calls(tmp_path):
    parts = [{"type": "text", "text": "Look"}, {"type": "text", "text": "here"}]
    call = {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 1}"}}
    records = [{"messages": [{"role": "user", "content": parts},
                             {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "content": "2"}, {"role": "assistant", "content": [parts[0]]}]},
               {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                             {"role": "assistant", "content": "a cat"}]}]
    reader = DatasetReader(write(tmp_path / "a.jsonl", records), skip_invalid=True)
    (example,) = reader.examples()
    assert [m["content"] for m in example.messages] == [
        "Look\nhere", json.dumps([call["function"]]), "2", "Look"]
    assert "image_url content (the studio trains on text only)" in reader.notes[0]


def info(folder: Path, entries: dict) -> None:
    (folder / "dataset_info.json").write_text(json.dumps(entries))


def test_dataset_info_columns_and_tags(tmp_path):
    write(tmp_path / "qa.csv", [{"question": "2+2?", "answer": "4", "sys": "Be exact.", "instruction": "unused"}])
    write(tmp_path / "chat.jsonl", [{"dialog": [{"speaker": "sys", "text": "Be kind."}, {"speaker": "me", "text": "hi"},
                                                {"speaker": "bot", "text": "hello"}]}])
    write(tmp_path / "corpus.parquet", [{"body": "plain text"}])
    write(tmp_path / "nosystem.json", [{"instruction": "q", "output": "a", "system": "ignored"}])
    info(tmp_path, {
        "qa": {"file_name": "qa.csv", "columns": {"prompt": "question", "response": "answer", "system": "sys"}},
        "chat": {"file_name": "chat.jsonl", "formatting": "sharegpt", "columns": {"messages": "dialog"},
                 "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "me", "assistant_tag": "bot",
                          "system_tag": "sys"}},
        "corpus": {"file_name": "corpus.parquet", "columns": {"prompt": "body"}},
        "nosystem": {"file_name": "nosystem.json"},  # without columns LLaMA-Factory reads no system field
        "hub": {"hf_hub_url": "someone/qa", "file_name": "qa.csv", "columns": {"prompt": "nothing"}},
    })
    got = {name: DatasetReader(tmp_path / name) for name in ("qa.csv", "chat.jsonl", "corpus.parquet", "nosystem.json")}
    assert got["qa.csv"].format == "alpaca (dataset_info.json: qa)"
    assert got["qa.csv"].examples()[0].messages == [{"role": "system", "content": "Be exact."},
                                                   {"role": "user", "content": "2+2?"},
                                                   {"role": "assistant", "content": "4"}]
    assert [(m["role"], m["content"]) for m in got["chat.jsonl"].examples()[0].messages] == [
        ("system", "Be kind."), ("user", "hi"), ("assistant", "hello")]
    assert got["corpus.parquet"].format == "text (dataset_info.json: corpus)"
    assert got["corpus.parquet"].examples()[0].messages == [{"role": "text", "content": "plain text"}]
    assert [m["role"] for m in got["nosystem.json"].examples()[0].messages] == ["user", "assistant"]
    # An explicit data.format reads the file by the built-in layout instead of the entry.
    assert DatasetReader(tmp_path / "nosystem.json", fmt="alpaca").examples()[0].messages[0]["role"] == "system"


@pytest.mark.parametrize("entry, words", [
    ({"ranking": True, "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}},
     "preference data"),
    ({"formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"}}, "KTO feedback data"),
    ({"formatting": "sharegpt", "columns": {"messages": "messages", "videos": "videos"}}, "text and images only"),
    ({"formatting": "openai"}, "unknown formatting 'openai'"),
])
def test_dataset_info_entries_sft_cannot_use_are_refused(tmp_path, entry, words):
    write(tmp_path / "d.json", ALPACA)
    info(tmp_path, {"mine": {"file_name": "d.json", **entry}})
    with pytest.raises(JobError) as caught:
        DatasetReader(tmp_path / "d.json", fmt="alpaca")  # refused whatever data.format says
    assert "entry 'mine'" in caught.value.message and words in caught.value.message


def test_a_save_to_disk_dataset_info_json_is_not_mistaken_for_llama_factorys(tmp_path):
    saved = write(tmp_path / "saved", ALPACA)
    assert json.loads((saved / "dataset_info.json").read_text())  # datasets' own metadata
    assert DatasetReader(saved).format == "alpaca"
    folder = tmp_path / "mine"
    folder.mkdir()
    write(folder / "part1.jsonl", [{"q": "hi", "a": "hello"}])
    info(tmp_path, {"mine": {"file_name": "mine", "columns": {"prompt": "q", "response": "a"}}})
    assert DatasetReader(folder).examples()[0].messages[-1]["content"] == "hello"  # the folder's own entry


def test_profile_of_a_csv_says_what_training_will(tmp_path):
    path = write(tmp_path / "a.csv", [*ALPACA, {"instruction": "q", "input": "", "output": ""}])
    profile = DatasetProfile.read(str(path), "bundled:tiny")
    assert "1 of 4 examples has an empty or null output (first: line 5)" in profile.problem
    profile = DatasetProfile.read(str(path), "bundled:tiny", skip_invalid=True)
    assert profile.format == "alpaca" and profile.count == 3 and profile.measured == 3
    assert len(profile.preview) == 3 and "skipped 1 of 4" in profile.notes[0]


def test_reading_tables_keeps_the_studio_torch_free(tmp_path):
    write(tmp_path / "a.parquet", ALPACA)
    write(tmp_path / "b.csv", ALPACA)
    code = ("import sys\nfrom backend.core.data.dataset_profile import DatasetProfile\n"
            f"for name in ('a.parquet', 'b.csv'):\n"
            f"    assert DatasetProfile.read({str(tmp_path)!r} + '/' + name).count == 3\n"
            "heavy = [m for m in ('torch', 'transformers', 'peft', 'accelerate') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_csv_fine_tunes_through_the_job_and_the_skip_is_reported(bundled_model, tmp_path):
    from tests.backend.test_techniques import run_job

    rows = [{"instruction": f"Repeat {w} twice.", "input": "", "output": f"{w} {w}"} for w in ("cat", "dog", "owl")]
    path = write(tmp_path / "train.csv", [*rows * 4, {"instruction": "Empty", "input": "", "output": ""}])
    events = run_job(tmp_path, [f"data.path={path}", "data.skip_invalid=true", "train.max_steps=2"])
    assert events[-1].type == "JobFinished", events[-1]
    warning = [e.detail for e in events if e.type == "PhaseChanged" and e.phase == "data_warning"]
    assert warning and "skipped 1 of 13 examples" in warning[0] and "(first: line 14)" in warning[0]
    assert sum(e.type == "MetricsLogged" and e.loss is not None for e in events) == 2


@pytest.mark.parametrize("name, data, words", [
    ("short.csv", b"instruction,output\nq,a\nq,a,extra\n", "not readable as CSV (Error tokenizing data."),
    ("header_only.csv", b"instruction,output\n", "the dataset is empty"),
    ("twice.csv", b"instruction,output,output\nq,a,b\n", "line 1: the header names 'output' more than once"),
    ("latin1.csv", "instruction,output\nq,a\ncaf\xe9,ok\n".encode("latin-1"), "line 3: not UTF-8 text"),
    ("broken.parquet", b"PAR1 not really", "not a readable Parquet file"),
])
def test_unreadable_tables_are_one_line(tmp_path, name, data, words):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(JobError) as caught:
        DatasetReader(tmp_path / name)
    assert words in caught.value.message and "\n" not in caught.value.message
