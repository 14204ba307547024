"""A table of bad data files, prompt files and model folders, each built in the test.

Every case is either refused in one line (kind bad_input) that names the file, line or field and
holds the fix, or, odd but usable, read as meant with a data note that says what was done. All run
in-process (the readers and the pre-load check), so the table costs seconds, not worker starts.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from tests.conftest import BUNDLED_MODEL, PRESET

Body = str | bytes | dict | list


def jsonl(*records: Any, end: str = "\n") -> str:
    return "".join(json.dumps(record) + end for record in records)


def alpaca(*words: str) -> list[dict[str, str]]:
    return [{"instruction": f"Say {word}.", "output": word} for word in words]


FOUR = alpaca("one", "two", "three", "four")
LONG = " ".join(["lorem ipsum"] * 60)  # far over a 32-token seq_len
HUGE = " ".join(["lorem ipsum"] * 2000)  # over 100 x a 32-token seq_len
TURN = " ".join(["lorem ipsum"] * 85)  # 1,019 characters: under the 1,024 a 32-token seq_len tokenizes whole


def chat(user: Any, answer: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": user}, {"role": "assistant", "content": answer}]}


def parts(*texts: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text} for text in texts]


@dataclass
class DataCase:
    id: str
    files: dict[str, Body]
    overrides: tuple[str, ...] = ()
    error: tuple[str, ...] = ()
    """Words of the one-line refusal; empty: the data must train."""
    where: tuple[str, ...] = ()
    """The file and line the refusal (or the note) names."""
    fix: tuple[str, ...] = ()
    """Words of the fix, in the message or the hint."""
    note: tuple[str, ...] = ()
    """Words of the data note an odd but usable input gets (none expected when empty)."""
    check: Callable[[str, Any], bool] | None = None
    """On the decoded training text and the DataStats."""


DATA_CASES = [
    DataCase("content_parts_read_as_text", {"parts.jsonl": jsonl(*(chat(parts("Hi", "there"), parts(w)) for w in
                                                                  ("one", "two", "three")))},
             check=lambda text, _: "Hi\nthere" in text and "'type'" not in text and "[{" not in text),
    DataCase("content_part_that_is_a_picture", {"parts.jsonl": jsonl(
        chat("Hi", "one"), chat([{"type": "image_url", "image_url": {"url": "cat.png"}}], "two"))},
             error=("image_url", "text only"), where=("parts.jsonl", "line 2"), fix=("skip_invalid",)),
    DataCase("images_column_with_a_text_only_model", {"mllm.jsonl": jsonl(
        {**chat("<image>Who is it?", "one"), "images": ["a.jpg"]}, chat("Hi", "two"))},
             error=("1 of 2 examples has images", "text only"), where=("mllm.jsonl", "line 1"),
             fix=("vision-language model", "skip_invalid")),
    DataCase("content_a_single_part_object", {"part.jsonl": jsonl(chat({"type": "text", "text": "Hi"}, "one"))},
             check=lambda text, _: "Hi" in text and "'type'" not in text),
    DataCase("sharegpt_value_as_parts", {"share.jsonl": jsonl({"conversations": [
        {"from": "human", "value": parts("Hi")}, {"from": "gpt", "value": parts("one")}]})},
             check=lambda text, _: "Hi" in text and "'type'" not in text),
    DataCase("messages_with_an_unknown_role", {"roles.jsonl": jsonl(chat("Hi", "one"), chat("Hi", "two", role="bot"))},
             error=("'bot'",), where=("roles.jsonl", "line 2"), fix=("user",)),
    DataCase("json_wrapped_in_data", {"wrapped.json": {"data": FOUR}},
             note=("'data'", "4 records"), where=("wrapped.json",), check=lambda _, s: s.examples == 4),
    DataCase("json_wrapped_beside_metadata", {"wrapped.json": {"version": 2, "examples": FOUR}},
             note=("'examples'",), where=("wrapped.json",), check=lambda _, s: s.examples == 4),
    DataCase("json_wrapped_two_lists", {"wrapped.json": {"train": FOUR, "test": FOUR[:1]}},
             error=("'test'", "'train'"), where=("wrapped.json",), fix=("JSON array",)),
    DataCase("json_one_pretty_printed_record", {"one.json": json.dumps(FOUR[0], indent=2)},
             check=lambda text, s: s.examples == 1 and "Say one." in text),
    DataCase("prompt_alone_longer_than_seq_len", {"long.jsonl": jsonl(*FOUR, {"instruction": LONG, "output": "x"},
                                                                      {"instruction": LONG, "output": "y"})},
             overrides=("train.seq_len=32",), note=("dropped 2 of 6", "prompt", "train.seq_len=32"),
             where=("long.jsonl", "line 5"), check=lambda _, s: s.truncated == 0 and s.examples == 4),
    DataCase("every_prompt_longer_than_seq_len", {"long.jsonl": jsonl({"instruction": LONG, "output": "x"},
                                                                      {"instruction": LONG, "output": "y"})},
             overrides=("train.seq_len=32",), error=("prompt", "longer than train.seq_len=32"),
             where=("long.jsonl", "line 1"), fix=("train.seq_len",)),
    DataCase("hundredfold_examples_refused", {"huge.jsonl": jsonl(FOUR[0], {"instruction": "a", "output": HUGE},
                                                                  {"instruction": "b", "output": HUGE})},
             overrides=("train.seq_len=32", "data.truncate=false"), error=("2 of 3", "longest", "train.seq_len=32"),
             where=("huge.jsonl", "line 2"), fix=("train.seq_len", "data.truncate")),
    # One message over 32 characters a token of seq_len is cut to that before it is tokenized, and said so.
    DataCase("hundredfold_examples_truncated", {"huge.jsonl": jsonl(FOUR[0], {"instruction": "a", "output": HUGE})},
             overrides=("train.seq_len=32",), note=("cut 1 of 2", "over 1,024 characters", "23,999 characters"),
             where=("huge.jsonl", "line 2"), check=lambda _, s: s.truncated == 1),
    DataCase("hundredfold_in_turns_each_under_the_cut", {"turns.jsonl": jsonl(chat("Say one.", "one"), {"messages": [
        {"role": role, "content": "Go on." if role == "user" else TURN} for role in ("user", "assistant") * 6]})},
             overrides=("train.seq_len=32",), note=("100 times", "longest"), where=("turns.jsonl", "line 2"),
             check=lambda _, s: s.truncated == 1),
    DataCase("one_null_output_skipped", {"nulls.jsonl": jsonl(FOUR[0], {"instruction": "Say none.", "output": None},
                                                              FOUR[1])},
             overrides=("data.skip_invalid=true",), note=("skipped 1 of 3", "null output"),
             where=("nulls.jsonl", "line 2"), check=lambda text, s: "None" not in text and s.examples == 2),
    DataCase("every_output_null", {"nulls.jsonl": jsonl(*({"instruction": "Say it.", "output": None},) * 3)},
             error=("no example can be trained on", "null output"), where=("nulls.jsonl", "line 1")),
    DataCase("answer_as_a_number", {"num.jsonl": jsonl({"instruction": "Six times seven?", "output": 42})},
             check=lambda text, _: "42" in text),
    DataCase("whitespace_only_output", {"blank.jsonl": jsonl(FOUR[0], {"instruction": "Say.", "output": "  \n"})},
             error=("empty or null output",), where=("blank.jsonl", "line 2")),
    DataCase("empty_string_prompt", {"empty.jsonl": jsonl(*FOUR[:2], {"instruction": "", "input": "", "output": "x"})},
             error=("empty or null instruction",), where=("empty.jsonl", "line 3")),
    DataCase("csv_columns_of_no_format", {"qa.csv": "question,answer\nSay one.,one\n"},
             error=("columns", "'answer'", "'question'", "instruction", "conversations"), where=("qa.csv",),
             fix=("dataset_info.json",)),
    DataCase("csv_with_semicolons", {"semi.csv": "instruction;output\nSay one.;one\nSay two.;two\n"},
             note=("';'",), where=("semi.csv",), check=lambda text, s: s.examples == 2 and ";" not in text),
    DataCase("bom_at_the_start", {"bom.jsonl": b"\xef\xbb\xbf" + jsonl(*FOUR).encode()},
             check=lambda _, s: s.examples == 4),
    DataCase("crlf_line_endings", {"crlf.jsonl": jsonl(*FOUR, end="\r\n")},
             check=lambda text, s: s.examples == 4 and "\r" not in text),
    DataCase("files_joined_each_with_a_bom", {"joined.jsonl": b"\xef\xbb\xbf" + jsonl(*FOUR[:2]).encode()
                                                            + b"\xef\xbb\xbf" + jsonl(*FOUR[2:]).encode()},
             note=("byte-order mark",), where=("joined.jsonl", "line 3"), check=lambda _, s: s.examples == 4),
    DataCase("jsonl_that_is_a_json_array", {"array.jsonl": json.dumps(FOUR, indent=2)},
             check=lambda _, s: s.examples == 4),
    DataCase("json_that_is_jsonl", {"lines.json": jsonl(*FOUR)}, check=lambda _, s: s.examples == 4),
    DataCase("jsonl_with_trailing_commas", {"commas.jsonl": jsonl(*FOUR, end=",\n")},
             note=("comma",), where=("commas.jsonl", "line 1"), check=lambda _, s: s.examples == 4),
    DataCase("a_list_instead_of_an_object_per_line", {"lists.jsonl": jsonl(["Say one.", "one"], ["Say two.", "two"])},
             error=("expected a JSON object", "list"), where=("lists.jsonl", "line 1"), fix=("instruction",)),
    DataCase("a_null_line", {"null.jsonl": jsonl(FOUR[0], None, FOUR[1])},
             error=("expected a JSON object", "null"), where=("null.jsonl", "line 2")),
    DataCase("json_array_with_a_trailing_comma", {"array.json": "[\n" + ",\n".join(map(json.dumps, FOUR)) + ",\n]\n"},
             error=("not valid JSON",), where=("array.json", "line 6")),
    DataCase("utf16_with_bom", {"wide.jsonl": jsonl(*FOUR).encode("utf-16")},
             note=("UTF-16",), where=("wide.jsonl",), check=lambda _, s: s.examples == 4),
    DataCase("a_folder_with_an_empty_file", {"set/a.jsonl": jsonl(*FOUR), "set/b.jsonl": ""},
             error=("the dataset is empty",), where=("b.jsonl",)),
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BUNDLED_MODEL)


def write(root: Path, files: dict[str, Body]) -> Path:
    """The files under root; -> the data path (the first file, or its folder when it lies in one)."""
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        path.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    first = Path(next(iter(files)))
    return root / first.parts[0]


def one_line(error: JobError, words: tuple[str, ...], where: tuple[str, ...], fix: tuple[str, ...]) -> None:
    assert error.kind == "bad_input", error.kind
    assert "\n" not in error.message and "Traceback" not in error.message, error.message
    for word in words + where:
        assert word in error.message, (word, error.message)
    for word in fix:
        assert word in f"{error.message} {error.hint}", (word, error.message, error.hint)


@pytest.mark.parametrize("case", DATA_CASES, ids=[c.id for c in DATA_CASES])
def test_bad_data(case: DataCase, tokenizer, tmp_path):
    from backend.training.tokenized import build_datasets

    path = write(tmp_path, case.files)
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0", *case.overrides])
    if case.error:
        with pytest.raises(JobError) as caught:
            build_datasets(config, tokenizer)
        one_line(caught.value, case.error, case.where, case.fix)
        return
    train, _, stats = build_datasets(config, tokenizer)
    notes = " | ".join(stats.notes)
    if case.note:
        for word in case.note + case.where:
            assert word in notes, (word, notes)
        assert all("\n" not in note for note in stats.notes)
    else:
        assert not stats.notes, notes
    text = "\n".join(tokenizer.decode(ids) for ids in train["input_ids"])
    assert "None" not in text
    assert case.check is None or case.check(text, stats), (text[:400], stats)


def test_the_token_cache_keeps_the_notes(tokenizer, tmp_path):
    """A second run on the same data reads the tokens from the cache, and must say the same notes."""
    from backend.training.tokenized import build_datasets

    path = write(tmp_path, {"long.jsonl": jsonl(*FOUR, {"instruction": LONG, "output": "x"})})
    config = RunConfig.load(PRESET, [f"data.path={path}", "data.validation_split=0", "train.seq_len=32"])
    *_, first = build_datasets(config, tokenizer)
    *_, second = build_datasets(config, tokenizer)
    assert second.from_cache and second.notes == first.notes and "dropped 1 of 5" in first.notes[0]


# --- eval --prompts FILE ---------------------------------------------------------------------------

PROMPT_CASES = [
    ("expected_null", jsonl({"prompt": "Say one.", "expected": None}), ("'expected'", "null"), "line 1"),
    ("prompt_empty", jsonl({"prompt": "Say one.", "expected": "one"}, {"prompt": " ", "expected": "two"}),
     ("empty", "'prompt'"), "line 2"),
    ("prompt_a_list", jsonl({"prompt": ["Say", "one"], "expected": "one"}), ("'prompt'", "text"), "line 1"),
    ("prompt_parts_image", jsonl(chat([{"type": "image_url"}], "one")), ("image_url",), "line 1"),
]


@pytest.mark.parametrize("name, body, words, line", PROMPT_CASES, ids=[c[0] for c in PROMPT_CASES])
def test_bad_prompts_file(name, body, words, line, tmp_path):
    from backend.evaluation.prompts import read_prompts

    path = write(tmp_path, {"prompts.jsonl": body})
    with pytest.raises(JobError) as caught:
        read_prompts(path)
    one_line(caught.value, words, ("prompts.jsonl", line), ())


def test_prompts_that_are_the_training_data_are_not_called_held_out(tmp_path):
    from backend.evaluation.prompts import read_prompts, training_overlap

    train = write(tmp_path, {"train.jsonl": jsonl(*FOUR)})
    config = RunConfig.load(PRESET, [f"data.path={train}"])
    same = training_overlap(read_prompts(train), config, train)
    assert same.count == 4 and same.same_file and same.flags == [True] * 4
    assert "4 of 4 prompts" in same.sentence() and "the training data itself" in same.sentence()
    assert "not held out" in same.sentence()

    mixed = write(tmp_path, {"p.jsonl": jsonl({"prompt": "Say  two.", "expected": "two"},
                                              {"prompt": "Say five.", "expected": "five"})})
    some = training_overlap(read_prompts(mixed), config, mixed)
    assert some.count == 1 and some.flags == [True, False] and not some.same_file
    assert "1 of 2 prompts" in some.sentence()
    fresh = write(tmp_path, {"q.jsonl": jsonl({"prompt": "Say six.", "expected": "six"})})
    assert training_overlap(read_prompts(fresh), config, fresh).count == 0


def test_the_cli_report_says_how_many_prompts_overlap():
    from backend.cli.eval import format_report

    side = {"base": {"accuracy": 0.5}, "tuned": {"accuracy": 1.0}}
    report = {"perplexity": None, "skipped": [], "exact_match": {
        "n": 4, "prompts_file": "/d/train.jsonl", "max_new_tokens": 8, **side,
        "in_training": 4, "same_file": True, "held_out": False, "overlap": "..."}}
    text = format_report(report)
    assert "4 of 4 prompts are also in the training data (the prompts file is the training data itself)" in text
    assert "not held out" in text
    clean = format_report({**report, "exact_match": {**report["exact_match"], "in_training": 0, "held_out": True,
                                                     "same_file": False, "overlap": ""}})
    assert "also in the training data" not in clean


# --- model folders -----------------------------------------------------------------------------------

def tiny_copy(root: Path, weights: bool = False) -> Path:
    """The bundled model's files in a folder of the test's own; the weights linked unless `weights`."""
    folder = root / "model"
    folder.mkdir()
    for file in BUNDLED_MODEL.iterdir():
        if file.name == "model.safetensors" and not weights:
            (folder / file.name).symlink_to(file)
        else:
            shutil.copy(file, folder / file.name)
    return folder


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is ...:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data), encoding="utf-8")


def config_edit(**changes: Any) -> Callable[[Path], None]:
    return lambda folder: edit_json(folder / "config.json", **changes)


def cut_weights(keep: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        weights = folder / "model.safetensors"
        raw = weights.read_bytes()
        weights.write_bytes(raw[:keep(len(raw))])
    return damage


def shard(folder: Path, missing: bool = True, index: bool = True) -> None:
    """The weights as 'shard 1 of 2' and an index that maps one tensor to a shard 2."""
    weights = folder / "model.safetensors"
    header = _header(weights)
    weights.rename(folder / "model-00001-of-00002.safetensors")
    names = sorted(k for k in header if k != "__metadata__")
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names}
    weight_map[names[-1]] = "model-00002-of-00002.safetensors"
    if index:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(size))


def lfs_pointer(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n"
                                              "oid sha256:0123abcd\nsize 16790528\n")


def adapter_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "bundled:tiny"}))


def bigger_tokenizer(folder: Path) -> None:
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["added_tokens"].append({"id": 5000, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")


def write_file(name: str, body: str | bytes) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        target = folder / name
        if target.is_symlink():
            target.unlink()
        target.write_bytes(body if isinstance(body, bytes) else body.encode("utf-8"))
    return damage


def remote_code(folder: Path) -> None:
    edit_json(folder / "config.json", auto_map={"AutoConfig": "configuration_odd.OddConfig",
                                                "AutoModelForCausalLM": "modeling_odd.OddForCausalLM"})
    (folder / "configuration_odd.py").write_text("# the config class would be here\n")


def tokenizer_remote_code(folder: Path) -> None:
    edit_json(folder / "tokenizer_config.json", auto_map={"AutoTokenizer": ["tokenization_odd.OddTokenizer", None]})


@dataclass
class ModelCase:
    id: str
    damage: Callable[[Path], None]
    words: tuple[str, ...]
    file: str
    """The file of the folder that the message names."""
    fix: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    weights: bool = False
    """Copy the weights (the case changes them) instead of linking them."""
    extra: dict[str, Any] = field(default_factory=dict)


MODEL_CASES = [
    ModelCase("unknown_model_type", config_edit(model_type="llamma"), ("model_type 'llamma'", "llama", "qwen2"),
              "config.json", fix=("model_type",)),
    ModelCase("no_model_type", config_edit(model_type=...), ("no model_type",), "config.json", fix=("model_type",)),
    ModelCase("not_a_causal_lm", config_edit(model_type="t5"), ("'t5'", "causal"), "config.json"),
    ModelCase("hidden_size_a_string", config_edit(hidden_size="256"), ("hidden_size", "'256'"), "config.json",
              fix=("Hugging Face",)),
    ModelCase("hidden_size_zero", config_edit(hidden_size=0), ("hidden_size", "0"), "config.json"),
    ModelCase("hidden_size_negative", config_edit(hidden_size=-256), ("hidden_size", "-256"), "config.json"),
    ModelCase("layers_a_fraction", config_edit(num_hidden_layers=2.5), ("num_hidden_layers", "2.5"), "config.json"),
    ModelCase("config_a_list", write_file("config.json", "[1, 2]"), ("JSON object", "list"), "config.json"),
    ModelCase("config_with_a_bom", lambda f: write_file("config.json", b"\xef\xbb\xbf" + (
        BUNDLED_MODEL / "config.json").read_bytes())(f), ("byte-order mark",), "config.json", fix=("UTF-8",)),
    ModelCase("weights_cut_short", cut_weights(lambda n: n - 4096), ("truncated", "bytes"), "model.safetensors",
              fix=("download",), weights=True),
    ModelCase("weights_header_cut_short", cut_weights(lambda n: 100), ("truncated", "header"), "model.safetensors",
              fix=("download",), weights=True),
    ModelCase("weights_empty", write_file("model.safetensors", b""), ("empty",), "model.safetensors",
              fix=("download",)),
    ModelCase("weights_with_bytes_after_the_tensors", lambda f: write_file("model.safetensors", (
        BUNDLED_MODEL / "model.safetensors").read_bytes() + b"\0" * 64)(f), ("64 bytes",), "model.safetensors",
              fix=("download",)),
    ModelCase("weights_header_not_json", write_file("model.safetensors", struct.pack("<Q", 6) + b"{oops}"),
              ("not a safetensors file",), "model.safetensors"),
    ModelCase("weights_a_git_lfs_pointer", lfs_pointer, ("Git LFS pointer",), "model.safetensors",
              fix=("git lfs pull",)),
    ModelCase("vocab_size_differs_from_the_weights", config_edit(vocab_size=5000), ("vocab_size 5000", "4096"),
              "model.safetensors", fix=("config.json",)),
    ModelCase("tokenizer_bigger_than_the_embedding", bigger_tokenizer, ("5000", "4096"), "tokenizer.json",
              fix=("tokenizer",)),
    ModelCase("tokenizer_json_not_json", write_file("tokenizer.json", '{"version": "1.0", "model": {'),
              ("not valid JSON", "line 1"), "tokenizer.json", fix=("copy",)),
    ModelCase("tokenizer_json_empty", write_file("tokenizer.json", ""), ("empty",), "tokenizer.json"),
    ModelCase("tokenizer_config_not_json", write_file("tokenizer_config.json", "{'chat_template': 1}"),
              ("not valid JSON",), "tokenizer_config.json"),
    ModelCase("remote_code_ticked_file_missing", remote_code, ("modeling_odd.py",), "config.json",
              fix=("copy",), overrides=("model.trust_remote_code=true",)),
    ModelCase("tokenizer_remote_code_not_ticked", tokenizer_remote_code, ("auto_map",), "tokenizer_config.json",
              fix=("trust_remote_code",)),
    ModelCase("a_shard_missing", shard, ("model-00002-of-00002.safetensors", "1 of 2"), "model.safetensors.index.json",
              fix=("download",)),
    ModelCase("shards_without_their_index", lambda f: shard(f, index=False), ("model.safetensors.index.json",),
              "model-00001-of-00002.safetensors", fix=("download",)),
    ModelCase("shard_index_not_json", lambda f: (shard(f), write_file("model.safetensors.index.json", "{")(f)),
              ("not valid JSON",), "model.safetensors.index.json"),
    ModelCase("an_adapter_folder_not_a_model", adapter_only, ("adapter",), "adapter_model.safetensors",
              fix=("base model",)),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c.id for c in MODEL_CASES])
def test_bad_model_folder(case: ModelCase, tmp_path):
    from backend.training.model.loading import check_model_folder

    folder = tiny_copy(tmp_path, case.weights)
    case.damage(folder)
    config = RunConfig.load(PRESET, [f"model.path={folder}", *case.overrides])
    with pytest.raises(JobError) as caught:
        check_model_folder(config)
    one_line(caught.value, case.words, (case.file,), case.fix)


def test_sound_folders_pass_the_check(tmp_path):
    """The checks refuse what is broken, not what is merely unusual: sharded weights, remote code present."""
    from backend.training.model.loading import check_model_folder

    folder = tiny_copy(tmp_path)
    assert check_model_folder(RunConfig.load(PRESET, [f"model.path={folder}"])) == folder
    shard(folder)
    index = folder / "model.safetensors.index.json"
    edit_json(index, weight_map={k: "model-00001-of-00002.safetensors" for k in json.loads(index.read_text())["weight_map"]})
    assert check_model_folder(RunConfig.load(PRESET, [f"model.path={folder}"])) == folder
    remote_code(folder)
    (folder / "modeling_odd.py").write_text("# the model class would be here\n")
    assert check_model_folder(RunConfig.load(PRESET, [f"model.path={folder}", "model.trust_remote_code=true"]))
