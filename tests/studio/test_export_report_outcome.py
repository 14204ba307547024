"""The export report widget shows the report's outcome: a "not verified" check (passed false in the
report's new shape) is amber and says how to check it elsewhere, never FAIL nor pass."""

from __future__ import annotations

OPEN = {
    "format": "gguf-f16", "outcome": "not verified", "passed": False, "path": "/x/gguf-f16", "total_bytes": 2048,
    "checks": [{"name": "perplexity", "what": "an independent reader reproducing the trained model",
                "measured": "not verified: transformers' GGUF loader has no mapping for rope_parameters.rope_type",
                "tolerance": 0.03, "outcome": "not verified", "passed": False, "verified": False,
                "reason": "transformers' GGUF loader has no mapping for rope_parameters.rope_type",
                "how_to_verify": "read it with llama.cpp itself: ... bench/llama_cpp_check.py /x/gguf-f16/model.gguf"},
               {"name": "tokenizer", "what": "the file's vocabulary", "measured": "identical",
                "tolerance": "identical", "outcome": "passed", "passed": True, "verified": True}],
}


def test_not_verified_outcome_is_amber_with_how_to_check_never_fail(qtbot):
    from studio.widgets.export_report_widget import AMBER, GREEN, RED, ExportReportWidget

    widget = ExportReportWidget()
    qtbot.addWidget(widget)
    widget.show_report(OPEN)
    rows = widget.rows()
    assert rows[0][1:4] == ("not verified", "+3.00%", "not verified") and rows[1][3] == "pass"
    assert widget.table.item(0, 3).foreground().color().name() == AMBER
    assert widget.table.item(0, 0).foreground().color().name() != RED
    assert "written, not verified (perplexity" in widget.verdict.text() and "FAILED" not in widget.verdict.text()
    assert AMBER in widget.verdict.styleSheet() and "llama.cpp" in widget.verdict.toolTip()
    assert widget.unverified == ["perplexity"]
    failed = dict(OPEN, outcome="failed", checks=[dict(OPEN["checks"][1], outcome="failed", passed=False,
                                                       measured="differs: chat template")])
    widget.show_report(failed)
    assert widget.rows()[0][3] == "FAIL" and RED in widget.verdict.styleSheet() and widget.unverified == []
    passed = dict(OPEN, outcome="passed", passed=True, checks=[OPEN["checks"][1]])
    widget.show_report(passed)
    assert "passed every check" in widget.verdict.text() and GREEN in widget.verdict.styleSheet()


def test_the_perplexity_shows_its_standard_error_and_its_precision_on_hover(qtbot):
    """issue 34: "+12.3% ± 1.1% (2,048 tokens in 64 rows)", and whether that error is under a fifth of the tolerance."""
    from backend.export.check_statistics import Increase, precision
    from studio.widgets.export_report_widget import ExportReportWidget

    widget = ExportReportWidget()
    qtbot.addWidget(widget)
    check = {"name": "perplexity", "what": "relative perplexity increase", "measured": 0.123, "tolerance": 0.25,
             "outcome": "passed", "passed": True, **precision(Increase(0.123, 0.08, 2048, 64), 0.25)}
    widget.show_report({"format": "gptq-int4", "outcome": "passed", "path": "/x", "checks": [check]})
    assert widget.rows()[0][1:4] == ("+12.3% ± 8.0% (2,048 tokens in 64 rows)", "+25.00%", "pass")
    assert "about 164 rows would bring it under" in widget.table.item(0, 1).toolTip()
