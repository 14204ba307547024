"""The three outcomes of an export's checks (passed, failed, not verified) and the precision a GGUF is read in.

Torch-free report helpers (backend/core/runs/export_report.py) read old and new reports alike; the CLI's
report printer uses them. What a GGUF is read in is checked here on the CPU for a GPU's load too;
each GGML type set's dtype: test_gguf_read_precision.py.
"""

from __future__ import annotations

import io

import pytest
import torch

from backend.core.runs.export_report import check_outcome, figure, outcome_of, report_outcome

PASSED_PPL = {"name": "perplexity", "measured": 0.004, "tolerance": 0.03, "outcome": "passed", "passed": True}
FAILED_TOP1 = {"name": "top1", "measured": 0.5, "tolerance": 0.98, "outcome": "failed", "passed": False}
OPEN_PPL = {"name": "perplexity", "measured": "not verified: no rope mapping", "tolerance": 0.03,
            "outcome": "not verified", "passed": False, "verified": False, "reason": "no rope mapping",
            "how_to_verify": "read it with llama.cpp itself: ... bench/llama_cpp_check.py ..."}
TOKENIZER = {"name": "tokenizer", "measured": "identical", "tolerance": "identical", "outcome": "passed", "passed": True}


def test_an_export_is_failed_over_not_verified_over_passed():
    assert outcome_of([PASSED_PPL, TOKENIZER]) == "passed"
    assert outcome_of([OPEN_PPL, TOKENIZER]) == "not verified"
    assert outcome_of([OPEN_PPL, FAILED_TOP1]) == "failed"


def test_reports_written_before_outcomes_existed_are_read_alike():
    old_open = {k: v for k, v in OPEN_PPL.items() if k != "outcome"} | {"passed": True}  # the old shape
    assert check_outcome(old_open) == "not verified"
    assert check_outcome({"name": "top1", "passed": False}) == "failed"
    assert report_outcome({"passed": True, "checks": [old_open, TOKENIZER]}) == "not verified"
    assert report_outcome({"passed": False}) == "failed" and report_outcome({"passed": True}) == "passed"


def test_figure_never_formats_a_sentence_as_a_number():
    """The crash of issue 25: a "not verified" perplexity went through a percentage format."""
    assert figure(OPEN_PPL) == "not verified: no rope mapping"
    assert figure(PASSED_PPL) == "+0.40% (tolerance +3%)"


@pytest.mark.parametrize("checks, verdict, marks", [
    ([OPEN_PPL, TOKENIZER], "WRITTEN, NOT VERIFIED", ["---- perplexity", "ok   tokenizer"]),
    ([PASSED_PPL, TOKENIZER], "PASSED", ["ok   perplexity"]),
    ([PASSED_PPL, FAILED_TOP1], "FAILED", ["FAIL top1"]),
])
def test_cli_verdict_and_marks_follow_the_outcome(checks, verdict, marks):
    from backend.cli.export import print_report

    out = io.StringIO()
    report = {"format": "gguf-f16", "path": "/x", "outcome": outcome_of(checks), "checks": checks}
    print_report(report, out)
    text = out.getvalue()
    assert text.startswith(f"{verdict}: gguf-f16") and all(m in text for m in marks), text
    assert ("to check it elsewhere: read it with llama.cpp" in text) == (verdict == "WRITTEN, NOT VERIFIED")
    if verdict == "WRITTEN, NOT VERIFIED":
        assert "(tolerance <= +3%)" in text  # the figure it would have to meet, not a raw number


def test_read_back_asks_transformers_for_the_chosen_dtype_without_hub_kernels(monkeypatch, tmp_path):
    """What from_pretrained is given on a GPU, checked on the CPU: an F16 Llama file in fp16, no kernels."""
    import transformers

    from backend.export import gguf_check
    from tests.families import tiny_config

    seen = {}

    def fake(folder, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(gguf_check, "weight_types", lambda path: {"F16", "F32"})
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(fake))
    model, _, why = gguf_check.read_back(tmp_path / "model.gguf", tiny_config("llama"), "cuda:0")
    assert model is None and "RuntimeError: stop here" in why
    assert seen["dtype"] == torch.float16 and seen["use_kernels"] is False and seen["device_map"] == {"": "cuda:0"}
    gguf_check.read_back(tmp_path / "model.gguf", tiny_config("gemma2"), "cuda:0")
    assert seen["dtype"] == torch.float16  # Gemma's activations, not its weights, overflow fp16: gguf_check.widen
