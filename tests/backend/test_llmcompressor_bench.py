"""bench/calibrated_vs_llmcompressor.py's own logic, without llmcompressor or a model: the venv it builds, its
options, and the table's token-by-token comparisons (a folder our stack cannot load, scored in the other venv)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import calibrated_vs_llmcompressor as bench  # noqa: E402
import llmcompressor_table as table  # noqa: E402


def test_venv_gets_the_cpu_torch_before_llmcompressor(tmp_path):
    commands = bench.venv_commands(tmp_path / "venv", "0.14.0.1", None)
    assert commands[0][1:] == ["-m", "venv", str(tmp_path / "venv")]
    assert commands[1][-1] == f"torch=={bench.TORCH}" and commands[2][-1] == "llmcompressor==0.14.0.1"
    assert bench.venv_commands(tmp_path / "venv", "0.14.0.1", "0.14.0.1") == []
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").touch()
    assert [c[-1] for c in bench.venv_commands(tmp_path / "venv", "0.14.0.1", "0.13.0")] == [
        f"torch=={bench.TORCH}", "llmcompressor==0.14.0.1"]


def test_quick_takes_fewer_rows_and_samples_wins():
    assert (bench.parse([]).samples, bench.parse([]).eval_rows) == (bench.SAMPLES, bench.EVAL_ROWS)
    quick = bench.parse(["--quick", "--formats", "w8a8"])
    assert (quick.samples, quick.eval_rows, quick.formats) == (bench.QUICK_SAMPLES, bench.QUICK_EVAL_ROWS, ["w8a8"])
    assert bench.parse(["--quick", "--samples", "5"]).samples == 5
    with pytest.raises(SystemExit):
        bench.parse(["--model", "a", "--run", "b"])


def test_paired_ratio_and_its_error_come_from_the_same_tokens():
    base = [1.0, 2.0, 3.0, 4.0]
    rel, se = table.paired([x + 0.01 for x in base], base)
    assert rel == pytest.approx(math.exp(0.01) - 1) and se == pytest.approx(0.0, abs=1e-12)
    rel, se = table.paired([1.1, 1.9, 3.1, 3.9], base)
    assert rel == pytest.approx(0.0, abs=1e-12) and se > 0.04
    with pytest.raises(ValueError):
        table.paired([1.0], base)


def _side(folder: str, error: str | None = None) -> dict:
    return {"folder": folder, "wall": 12.3, "rss": 6.5e8, "quantize": 4.0, "error": error}


def test_table_compares_in_one_environment_and_through_merged_across_two():
    merged = [2.0, 2.0, 2.0, 2.0]
    scores = {"m": {"all": merged, "answers": [0.1]}, "o/w8a8": {"all": [2.02] * 4, "answers": [0.1]},
              "l/w8a8": {"all": [2.01] * 4, "answers": [0.1]}, "o/awq": {"all": [2.03] * 4, "answers": [0.2]},
              "l/awq": {"error": "RuntimeError: size mismatch: x.weight_zero_point ckpt: [32, 2] vs model: [256, 2]"}}
    elsewhere = {"m": {"all": [2.1] * 4, "answers": [0.1]}, "l/awq": {"all": [2.11] * 4, "answers": [0.1]}}
    sides = {("w8a8", "ours"): _side("o/w8a8"), ("w8a8", "llmcompressor"): _side("l/w8a8"),
             ("awq", "ours"): _side("o/awq"), ("awq", "llmcompressor"): _side("l/awq"),
             ("gptq", "ours"): _side("o/gptq"), ("gptq", "llmcompressor"): _side("l/gptq", "exit 1: boom")}
    text = table.table(["w8a8", "awq", "gptq"], sides, scores, "m", elsewhere)
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in text.splitlines()[2:]}
    assert f"{math.exp(2.02):.4f}" in rows["w8a8", "ours"] and f"{(math.exp(0.01) - 1) * 100:+.2f}%" in \
        rows["w8a8", "ours"]
    awq = rows["awq", "llmcompressor"]
    assert "in llmcompressor's venv" in awq and "zero_point" in awq and "(there)" in awq
    assert f"≈ {(math.exp(0.03) / math.exp(0.01) - 1) * 100:+.2f}%" in rows["awq", "ours"]
    assert "did not write: exit 1: boom" in rows["gptq", "llmcompressor"]
    assert "| 12 | 4 | 0.65 |" in rows["gptq", "ours"]


def test_table_prints_again_from_a_work_folder(tmp_path):
    import json

    (tmp_path / "perplexity.json").write_text(json.dumps({"m": {"all": [1.0], "answers": [0.5]},
                                                          "o": {"all": [1.1], "answers": [0.5]},
                                                          "l": {"all": [1.2], "answers": [0.5]}}))
    sides = [{"format": "w8a8", "tool": "ours", **_side("o")}, {"format": "w8a8", "tool": "llmcompressor", **_side("l")}]
    (tmp_path / "results.json").write_text(json.dumps({"formats": ["w8a8"], "merged": "m", "sides": sides,
                                                       "note": "the note"}))
    text = bench.render(tmp_path)
    assert f"| w8a8 | llmcompressor | {math.exp(1.2):.4f} |" in text and text.endswith(f"the note; work folder {tmp_path}")
