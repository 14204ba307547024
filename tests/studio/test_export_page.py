"""Export page against the fake worker: options, progress, the verification report, overwrite, evaluate."""

from __future__ import annotations

from pathlib import Path

from backend.core.runs.run_folder import RunFolder
from tests.fakes import fake_command

WAIT_MS = 30_000


def finished_run(studio, name: str = "done") -> RunFolder:
    """A run folder whose fine-tune finished (as the worker would have recorded it)."""
    config = studio.config.config().model_copy(update={"name": name})
    folder = RunFolder.create(config)
    folder.append_event({"type": "JobStarted", "v": 1, "job": "finetune", "run_dir": str(folder.path), "max_steps": 10})
    folder.append_event({"type": "JobFinished", "v": 1, "run_dir": str(folder.path), "steps": 10})
    return folder


def test_export_runs_shows_progress_and_the_passing_report(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    older = finished_run(studio, "older")
    folder = finished_run(studio, "newer")
    page = studio.pages["export"]
    studio.window.show_page("export")
    assert page.picker.path() in (str(folder.path), str(older.path))
    assert page.picker.combo.count() == 2
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(folder.path)))
    page.set_format("merged")
    assert "transformers" in page.format_help.text() and page.dtype_combo.isEnabled()
    assert page.out_edit.text() == str(folder.path / "exports" / "merged")
    page.set_format("gguf-q4_0")
    assert "llama.cpp" in page.format_help.text() and not page.dtype_combo.isEnabled()
    assert page.out_edit.text().endswith("gguf-q4_0")
    page.set_format("adapter")
    page.export_button.click()
    assert page.jobs.is_running() and not page.export_button.isEnabled()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.progress.value() == page.progress.maximum() == 1
    assert page.status_label.text() == ""  # the verdict says it, once
    rows = page.report.rows()
    assert [r[0] for r in rows] == ["logits", "tokenizer"] and rows[0][1:4] == ("0.0031", "0.01", "pass")
    what = page.report.table.item(0, 4)
    assert what.text() and what.toolTip() == what.text()  # "What it measures" reads whole on hover
    assert "passed every check" in page.report.verdict.text()
    assert RunFolder(folder.path).status() == "finished"  # the export does not change the run's status
    opened = []
    page.open_url = opened.append
    page.open_button.click()
    assert Path(opened[0].toLocalFile()) == folder.path / "exports" / "adapter"


def test_a_failed_check_is_shown_in_red_and_overwrite_asks_first(qtbot, make_studio):
    studio = make_studio(fake_command("export_fail"))
    folder = finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.set_format("gguf-q4_0")
    page.export_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert "failed its perplexity check" in page.status_label.text()
    rows = page.report.rows()
    assert rows[0][:4] == ("perplexity", "+31.00%", "+25.00%", "FAIL")
    assert page.report.table.item(0, 0).foreground().color().name() == "#dc2626"
    assert "FAILED perplexity" in page.report.verdict.text()
    # the folder exists now: without Overwrite the page refuses, with it the person is asked
    page.export_button.click()
    assert not page.jobs.is_running() and "tick Overwrite" in page.status_label.text()
    asked = []
    page.confirm_overwrite = lambda path: asked.append(path) or False
    page.overwrite_check.setChecked(True)
    page.export_button.click()
    assert asked == [folder.path / "exports" / "gguf-q4_0"] and not page.jobs.is_running()
    page.confirm_overwrite = lambda path: True
    page.export_button.click()
    assert page.jobs.is_running()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)


def test_evaluate_shows_base_and_tuned_side_by_side(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    evaluation = page.evaluation
    assert evaluation.figures() == [("—", "—"), ("—", "—")]
    evaluation.evaluate_button.click()
    qtbot.waitUntil(lambda: not evaluation.jobs.is_running(), timeout=WAIT_MS)
    assert evaluation.figures() == [("12.50", "4.25"), ("25.0% (1/4)", "75.0% (3/4)")]
    assert "What is 2 + 2?" in evaluation.examples.toPlainText()
    assert (folder.path / "eval_report.json").is_file()
    assert RunFolder(folder.path).status() == "finished"


UNVERIFIED = {
    "format": "gguf-q8_0", "passed": True, "path": "/x/gguf-q8_0", "total_bytes": 2048,
    "checks": [{"name": "perplexity", "what": "an independent reader reproducing the trained model",
                "measured": "not verified: transformers reads gpt_neox GGUF files as nothing it can run",
                "tolerance": 0.03, "passed": True, "verified": False,
                "reason": "transformers reads gpt_neox GGUF files as nothing it can run",
                "how_to_verify": "python bench/llama_cpp_check.py /x/gguf-q8_0/model.gguf --hf MERGED"},
               {"name": "tokenizer", "what": "the file's vocabulary", "measured": "identical",
                "tolerance": "identical", "passed": True}],
}


def test_a_check_no_reader_could_run_is_not_verified_never_pass(qtbot):
    """A GGUF file transformers cannot read back is "not verified" in amber with how to check it, not a pass."""
    from studio.widgets.export_report_widget import AMBER, ExportReportWidget

    widget = ExportReportWidget()
    qtbot.addWidget(widget)
    widget.show_report(UNVERIFIED)
    rows = widget.rows()
    assert rows[0][3] == "not verified" and rows[1][3] == "pass"
    assert widget.table.item(0, 3).foreground().color().name() == AMBER
    assert "llama_cpp_check.py" in widget.table.item(0, 3).toolTip()
    assert "not verified (perplexity" in widget.verdict.text() and "passed every check" not in widget.verdict.text()
    assert widget.unverified == ["perplexity"]
    widget.clear()
    assert widget.unverified == []


def test_the_cli_prints_an_unverified_check_apart_from_a_pass():
    import io

    from backend.cli.export import print_report

    out = io.StringIO()
    print_report(UNVERIFIED, out)
    text = out.getvalue()
    assert text.startswith("WRITTEN, NOT VERIFIED: gguf-q8_0")
    assert "---- perplexity" in text and "ok   tokenizer" in text and "ok   perplexity" not in text
    assert "to check it elsewhere: python bench/llama_cpp_check.py" in text


def test_the_dtype_defaults_to_the_bases_own_as_the_cli_does(qtbot, make_studio):
    import json

    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.set_format("merged")
    assert page.dtype_combo.currentText() == "the base's own"
    page.export_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    report = folder.path / "exports" / "merged" / "export_report.json"
    assert json.loads(report.read_text())["dtype"] is None  # no dtype sent: the job picks the base's own
    page.dtype_combo.setCurrentIndex(page.dtype_combo.findData("fp16"))
    page.overwrite_check.setChecked(True)
    page.confirm_overwrite = lambda path: True
    page.export_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert json.loads(report.read_text())["dtype"] == "fp16"


def test_another_run_in_the_picker_clears_the_last_export_and_a_refresh_keeps_it(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    other = finished_run(studio, "other")
    folder = finished_run(studio, "exported")
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(folder.path)))
    page.set_format("adapter")
    page.export_button.click()
    qtbot.waitUntil(lambda: not page.jobs.is_running(), timeout=WAIT_MS)
    assert page.report.rows() and "passed every check" in page.report.verdict.text()
    studio.window.show_page("train")
    studio.window.show_page("export")  # the picker refreshes, the same run stays chosen: the result stays
    assert page.report.rows() and "passed every check" in page.report.verdict.text()
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(other.path)))
    assert page.report.rows() == [] and page.report.verdict.text() == ""  # that export was of another run


def test_overwrite_never_offers_to_replace_the_users_own_folder(qtbot, make_studio, tmp_path):
    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    mine = tmp_path / "documents"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    page.out_edit.setText(str(mine))
    page.overwrite_check.setChecked(True)
    asked = []
    page.confirm_overwrite = lambda path: asked.append(path) or True
    page.export_button.click()
    assert not page.jobs.is_running() and asked == []  # refused before any question or worker
    assert "is not an earlier export" in page.status_label.text()
    assert (mine / "thesis.txt").read_text() == "years of work"


def test_open_folder_without_a_file_manager_says_so_in_the_status_line(qtbot, make_studio):
    from PySide6.QtCore import Qt

    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.open_url = lambda url: False  # what QDesktopServices.openUrl says when nothing can open a folder
    page.open_button.click()
    text = page.status_label.text()
    assert "No file manager could open" in text and str(folder.path) in text  # no export yet: the run folder
    assert page.status_label.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse


def test_calibrated_formats_ask_how_many_rows_to_calibrate_on_and_pass_it_to_the_job(qtbot, make_studio):
    from backend.core.registries.export_formats import calibration_samples

    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    page = studio.pages["export"]
    studio.window.show_page("export")
    started = []
    page.jobs.start = lambda folder, config, job, params: started.append(params)
    page.set_format("merged")
    assert not page.samples_spin.isVisibleTo(page) and not page.samples_label.isVisibleTo(page)
    page.export_button.click()
    assert "calibration_samples" not in started[-1]  # only the calibrated formats read it
    for fmt in ("gptq-int4", "awq-int4", "w8a8"):
        page.set_format(fmt)
        assert page.samples_spin.isVisibleTo(page) and "--calibration-samples" in page.samples_spin.toolTip()
    assert page.samples_spin.value() == calibration_samples(None)  # the CLI's default
    page.samples_spin.setValue(32)
    page.export_button.click()
    assert started[-1]["format"] == "w8a8" and started[-1]["calibration_samples"] == 32
    page.samples_spin.setValue(100_000)  # the box holds what the job accepts
    assert calibration_samples(page.samples_spin.value()) == page.samples_spin.value()


def test_the_format_help_shows_every_line_in_a_small_window(qtbot, make_studio):
    from PySide6.QtWidgets import QApplication

    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    page = studio.pages["export"]
    studio.window.resize(1024, 700)
    studio.window.show_page("export")
    qtbot.waitExposed(studio.window)
    for fmt in ("merged", "gptq-int4", "adapter", "w8a8", "gguf-q4_0"):  # as a form row it kept another text's height
        page.set_format(fmt)
        for _ in range(3):
            QApplication.processEvents()
        help_label = page.format_help
        assert help_label.text().startswith(f"{fmt}: ")
        assert help_label.height() >= help_label.heightForWidth(help_label.width()), fmt


def test_a_vision_language_runs_page_greys_the_formats_it_cannot_export(qtbot, make_studio, tmp_path):
    from tests import vision_models

    studio = make_studio(fake_command("normal"))
    text = finished_run(studio, "text")
    config = studio.config.config()
    config.model.path = str(vision_models.build_tiny_vlm("llava", tmp_path / "vlm"))  # no mmproj layout: GGUF greyed
    vlm = RunFolder.create(config.model_copy(update={"name": "vlm"}))
    vlm.append_event({"type": "JobFinished", "v": 1, "run_dir": str(vlm.path), "steps": 10})
    page = studio.pages["export"]
    studio.window.show_page("export")
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(text.path)))
    page.set_format("gguf-q8_0")
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(vlm.path)))
    model = page.format_combo.model()
    enabled = {page.format_combo.itemData(i): model.item(i).isEnabled() for i in range(page.format_combo.count())}
    assert [name for name, on in enabled.items() if on] == ["adapter", "merged", "bnb-8bit", "bnb-4bit", "gptq-int4",
                                                             "awq-int4", "w8a8"]
    assert page.fmt() == "merged"
    tip = page.format_combo.itemData(page.format_combo.findData("gguf-q8_0"), 3)
    assert tip.startswith("gguf-q8_0 of a LLaVA-1.5 run is not built yet (the mmproj half")
    page.set_format("gptq-int4")  # the help says what the export holds of the image side
    assert "Of this LLaVA-1.5 run: the language model's layers calibrated" in page.format_help.text()
    page.picker.combo.setCurrentIndex(page.picker.combo.findData(str(text.path)))
    assert all(model.item(i).isEnabled() for i in range(page.format_combo.count()))
    assert "Of this" not in page.format_help.text()  # a text run: the format's description alone
