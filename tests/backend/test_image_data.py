"""Rows with images (issue 35): every shape read, every bad image refused in one line naming the row
and the fix (or skipped and counted), the decompression bomb refused before decoding, and odd modes
converted as transformers' image processors do. Images are built here with Pillow, a few pixels each."""

from __future__ import annotations

import base64
import io
import json
import shutil
import struct
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from PIL import Image

from backend.core.data.conversation import IMAGE_MARKER, InvalidExample
from backend.core.data.dataset_profile import DatasetProfile
from backend.core.data.examples import DatasetReader
from backend.core.data.images import MAX_PIXELS, ImageRef, decode, probe, resolve, to_rgb
from backend.core.errors import JobError
from tests.conftest import ROOT

PEER = ROOT / "tests" / "fixtures" / "peer-data"


def picture(path: Path, size: tuple[int, int] = (12, 8), mode: str = "RGB", color: object = "red", **save) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path, **save)
    return path


def size_of(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


def png_bytes(size: tuple[int, int] = (4, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, "blue").save(out, "PNG")
    return out.getvalue()


def chat(user: object, answer: str = "A cat.", **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}], **extra}


def jsonl(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read(path: Path, **options: object) -> list:
    return DatasetReader(path, max_images=options.pop("max_images", None), **options).examples()


def refusal(path: Path, **options: object) -> JobError:
    with pytest.raises(JobError) as caught:
        read(path, **options)
    assert "\n" not in caught.value.message
    return caught.value


# --- the shapes -------------------------------------------------------------------------------------

def test_llama_factory_mllm_demo_reads_by_its_entry_and_by_detection(tmp_path):
    by_entry = DatasetReader(PEER / "mllm_demo.json", max_images=None)
    assert by_entry.format == "sharegpt (dataset_info.json: mllm_demo)"
    examples = by_entry.examples()
    assert len(examples) == 6 and [len(e.images) for e in examples] == [2, 1, 1, 2, 1, 1]
    assert examples[0].messages[0]["content"] == "<image>Who are they?"
    assert examples[0].images[0].path == PEER / "mllm_demo_data" / "1.jpg"
    assert (examples[1].images[0].width, examples[1].images[0].height) == size_of(PEER / "mllm_demo_data" / "2.jpg")
    shutil.copy(PEER / "mllm_demo.json", tmp_path / "mllm_demo.json")  # alone: messages + images detected
    shutil.copytree(PEER / "mllm_demo_data", tmp_path / "mllm_demo_data")
    detected = DatasetReader(tmp_path / "mllm_demo.json", max_images=None)
    assert detected.format == "messages" and detected.layouts[0].images == "images"
    assert [e.messages for e in detected.examples()] == [e.messages for e in examples]


def test_sharegpt_conversations_with_markers(tmp_path):
    picture(tmp_path / "a.png")
    record = {"conversations": [{"from": "human", "value": "What is it?<image>"}, {"from": "gpt", "value": "Red."}],
              "images": ["a.png"]}
    [example] = read(jsonl(tmp_path / "d.jsonl", record))
    assert example.messages[0] == {"role": "user", "content": "What is it?<image>"}
    assert example.images[0].path == tmp_path / "a.png"


def test_openai_parts_path_file_url_data_uri_and_image_part(tmp_path):
    picture(tmp_path / "pics" / "a.png")
    uri = "data:image/png;base64," + base64.b64encode(png_bytes((5, 3))).decode()
    record = chat([{"type": "text", "text": "Compare"},
                   {"type": "image_url", "image_url": {"url": "pics/a.png"}},
                   {"type": "image_url", "image_url": {"url": (tmp_path / "pics" / "a.png").as_uri()}},
                   {"type": "image_url", "image_url": {"url": uri}},
                   {"type": "image", "image": "pics/a.png"},
                   {"type": "text", "text": "please."}])
    [example] = read(jsonl(tmp_path / "d.jsonl", record))
    assert example.messages[0]["content"] == f"Compare\n{IMAGE_MARKER * 4}please."
    assert [i.path for i in example.images] == [tmp_path / "pics" / "a.png"] * 2 + [None, tmp_path / "pics" / "a.png"]
    assert (example.images[2].width, example.images[2].height) == (5, 3)


def test_trl_placeholder_parts_take_the_images_column(tmp_path):
    picture(tmp_path / "a.png")
    [example] = read(jsonl(tmp_path / "d.jsonl", chat([{"type": "image"}, {"type": "text", "text": "Hi"}],
                                                       images=["a.png"])))
    assert example.messages[0]["content"] == "<image>Hi" and len(example.images) == 1


def test_parquet_and_save_to_disk_image_columns(tmp_path):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    table = datasets.Dataset.from_dict({"image": [{"bytes": png_bytes((6, 2)), "path": None}],
                                        "text": ["a blue square"]}, features=features)
    table.to_parquet(str(tmp_path / "d.parquet"))
    [example] = read(tmp_path / "d.parquet")
    assert example.messages == [{"role": "text", "content": "<image>a blue square"}]  # images lead raw text
    assert (example.images[0].width, example.images[0].height) == (6, 2)
    listed = datasets.Dataset.from_dict(
        {"images": [[{"bytes": png_bytes(), "path": None}] * 2], "instruction": ["Same?"], "output": ["Yes."]},
        features=datasets.Features({"images": datasets.List(datasets.Image()), "instruction": datasets.Value("string"),
                                    "output": datasets.Value("string")}))
    listed.save_to_disk(str(tmp_path / "saved"))
    before = sorted(p.name for p in (tmp_path / "saved").iterdir())
    [example] = read(tmp_path / "saved")
    assert example.messages[0]["content"] == "<image><image>Same?" and len(example.images) == 2
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == before  # nothing written beside the data


def test_csv_and_jsonl_with_a_path_column(tmp_path):
    picture(tmp_path / "img" / "a.jpg", format="JPEG")
    (tmp_path / "d.csv").write_text("image,instruction,output\nimg/a.jpg,What colour?,Red.\n")
    [example] = read(tmp_path / "d.csv")
    assert example.messages[0]["content"] == "<image>What colour?" and example.images[0].path == tmp_path / "img/a.jpg"
    path = jsonl(tmp_path / "d.jsonl", {"images": ["img/a.jpg"], "text": "A red picture."})
    assert read(path)[0].images[0].label == "img/a.jpg"


# --- bad input: one line naming the row and the fix; skip_invalid counts ----------------------------

def bad_rows(tmp_path: Path) -> dict[str, dict]:
    picture(tmp_path / "ok.png")
    (tmp_path / "notes.png").write_text("not a picture")
    noise = io.BytesIO()
    Image.effect_noise((64, 64), 50).save(noise, "PNG")
    whole = noise.getvalue()
    (tmp_path / "cut.png").write_bytes(whole[:-200])  # the end of its pixels gone
    middle = len(whole) // 2
    (tmp_path / "flipped.png").write_bytes(whole[:middle] + bytes([whole[middle] ^ 0xFF]) + whole[middle + 1:])
    return {
        "a missing image": chat("<image>Hi", images=["gone.png"]),
        "an image file Pillow cannot read": chat("<image>Hi", images=["notes.png"]),
        "a truncated image": chat("<image>Hi", images=["cut.png"]),
        "a corrupt image": chat("<image>Hi", images=["flipped.png"]),
        f"fewer {IMAGE_MARKER} markers than images": chat("Hi", images=["ok.png"]),
        f"more {IMAGE_MARKER} markers than images": chat("<image><image>Hi", images=["ok.png"]),
    }


@pytest.mark.parametrize("problem", ["a missing image", "an image file Pillow cannot read", "a truncated image",
                                     "a corrupt image",
                                     f"fewer {IMAGE_MARKER} markers than images",
                                     f"more {IMAGE_MARKER} markers than images"])
def test_each_bad_row_is_named_with_its_line_and_fix(tmp_path, problem):
    rows = bad_rows(tmp_path)
    path = jsonl(tmp_path / "d.jsonl", chat("<image>Fine", images=["ok.png"]), rows[problem])
    error = refusal(path)
    assert f"1 of 2 examples has {problem} (first: line 2" in error.message
    assert "data.skip_invalid" in error.message and error.hint  # the fix for this problem


def test_skip_invalid_leaves_every_bad_row_out_and_counts_them(tmp_path):
    rows = bad_rows(tmp_path)
    path = jsonl(tmp_path / "d.jsonl", chat("<image>Fine", images=["ok.png"]), *rows.values())
    reader = DatasetReader(path, skip_invalid=True, max_images=None)
    assert [e.index for e in reader.examples()] == [0]
    assert reader.skipped == len(rows) and f"skipped {len(rows)} of {len(rows) + 1} examples" in reader.notes[-1]


def test_a_second_image_where_the_family_takes_one(tmp_path):
    picture(tmp_path / "ok.png")
    path = jsonl(tmp_path / "d.jsonl", chat("<image>One", images=["ok.png"]), chat("<image><image>Two",
                                                                                   images=["ok.png", "ok.png"]))
    error = refusal(path, max_images=1)
    assert "more images than the model takes (1 image a row) (first: line 2, 2 images)" in error.message
    assert "keep 1 image a row" in error.hint


def test_a_text_only_model_refuses_image_rows_as_before(tmp_path):
    picture(tmp_path / "ok.png")
    path = jsonl(tmp_path / "d.jsonl", chat("<image>One", images=["ok.png"]))
    error = refusal(path, max_images=0)
    assert "text only" in error.message and "vision-language model" in error.hint


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header says width x height, with one tiny (invalid) data chunk: built in microseconds."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("side", [30_000, 9_500])  # past Pillow's own refusal, and between its warning and refusal
def test_a_decompression_bomb_is_refused_before_decoding(tmp_path, side):
    (tmp_path / "bomb.png").write_bytes(png_claiming(side, side))
    path = jsonl(tmp_path / "d.jsonl", chat("<image>Hi", images=["bomb.png"]))
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(JobError) as caught:
        read(path)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert f"an image over {MAX_PIXELS:,} pixels, refused before decoding" in caught.value.message
    assert "line 1, bomb.png" in caught.value.message and "shrink it" in caught.value.hint
    assert peak < 20 * 2**20 and seconds < 2  # decoded, 30000 x 30000 RGB would be 2.5 GiB


def test_a_data_uri_web_address_and_bad_base64_are_named(tmp_path):
    for source, words in (("https://example.com/a.png", "web address"), ("data:image/png;base64,@@@", "broken"),
                          ("data:text/plain,hi", "not a base64 image")):
        with pytest.raises(InvalidExample) as caught:
            resolve(source, tmp_path)
        assert words in caught.value.problem and caught.value.fix


# --- modes, as the processors expect ---------------------------------------------------------------

def test_transparency_goes_on_white_like_transformers_convert_to_rgb(tmp_path):
    rgba = Image.new("RGBA", (2, 1), (0, 0, 0, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    assert list(to_rgb(rgba).get_flattened_data()) == [(255, 255, 255), (255, 0, 0)]
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 0, 0, 255, 0])
    palette.putpixel((1, 0), 1)
    palette.info["transparency"] = 0
    assert list(to_rgb(palette).get_flattened_data()) == [(255, 255, 255), (0, 255, 0)]
    assert to_rgb(Image.new("LA", (1, 1), (0, 0))).getpixel((0, 0)) == (255, 255, 255)


def test_16_bit_cmyk_and_exif_rotation(tmp_path):
    deep = Image.new("I;16", (1, 1), 40_000)
    assert to_rgb(deep).getpixel((0, 0)) == (156, 156, 156)  # 40000 / 256, not clipped to 255
    assert to_rgb(Image.new("CMYK", (1, 1), (0, 255, 255, 0))).getpixel((0, 0)) == (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: a 12 x 8 file is shown 8 x 12
    path = picture(tmp_path / "r.jpg", (12, 8), format="JPEG", exif=exif.tobytes())
    ref = probe(ImageRef("r.jpg", path=path))
    assert (ref.width, ref.height) == (8, 12) and decode(ref).size == (8, 12) and decode(ref).mode == "RGB"


# --- the Data page's profile ------------------------------------------------------------------------

def test_profile_counts_image_tokens_through_the_callable():
    tokens = lambda width, height: (width // 100) * (height // 100)  # noqa: E731  (a fake family's rule)
    profile = DatasetProfile.read(str(PEER / "mllm_demo.json"), image_tokens=tokens)
    assert profile.problem == "" and profile.image_counts == (2, 1, 1, 2, 1, 1) and profile.image_tokens_known
    sizes = [[size_of(PEER / "mllm_demo_data" / f"{n}.jpg") for n in row] for row in
             ([1, 1], [2], [3], [1, 1], [2], [3])]
    pictures = [sum(tokens(*size) for size in row) for row in sizes]
    assert [total - text for total, text in zip(profile.lengths, profile.text_lengths)] == pictures
    assert [n for _, n in profile.preview_tokens] == pictures[:5] and len(profile.preview_images[0]) == 2
    unknown = DatasetProfile.read(str(PEER / "mllm_demo.json"))
    assert not unknown.image_tokens_known and unknown.lengths == unknown.text_lengths
    assert unknown.preview_tokens[0][1] is None


def test_the_profile_decodes_the_shown_rows_only_and_training_every_row(tmp_path):
    rows = bad_rows(tmp_path)
    fine = [chat("<image>Fine", images=["ok.png"])] * 6
    path = jsonl(tmp_path / "d.jsonl", *fine, rows["a truncated image"])  # line 7: past the five shown
    assert DatasetProfile.read(str(path)).problem == ""  # its header is whole
    assert "a truncated image (first: line 7, cut.png" in refusal(path).message
    shown = jsonl(tmp_path / "e.jsonl", rows["a truncated image"], *fine)
    assert "a truncated image (first: line 1" in DatasetProfile.read(str(shown)).problem


def test_a_marker_is_counted_as_its_image_not_as_text(tmp_path):
    picture(tmp_path / "ok.png")
    path = jsonl(tmp_path / "d.jsonl", chat("<image>Describe the picture", images=["ok.png"]),
                 chat("Describe the picture"))
    profile = DatasetProfile.read(str(path), "bundled:tiny", image_tokens=lambda width, height: 9)
    assert profile.text_lengths[0] == profile.text_lengths[1] and profile.lengths == (profile.lengths[1] + 9,
                                                                                      profile.lengths[1])
