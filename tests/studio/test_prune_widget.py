"""The Export page's Prune section: picks checked against config.json before a worker starts (one red line),
the params the prune job is given, and the report or ranking shown as the CLI prints it."""

from __future__ import annotations

import json

from backend.core.runs.run_folder import RunFolder
from studio.job_controller import JobOutcome
from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run

REPORT = {
    "path": "/runs/x/pruned", "dtype": "bf16", "picks": "layers 1", "removed": {"layers": [1]},
    "shapes": {"before": {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "intermediate_size": 768},
               "after": {"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 768}},
    "parameters": {"before": 4196608, "after": 3409664},
    "estimate": {"device": "cpu", "method": "lora", "before_bytes": 290132992, "after_bytes": 244105216},
    "perplexity": {"tokens": 105, "before": {"perplexity": 2199.1}, "after": {"perplexity": 2484.2}},
    "exact_match": None, "skipped": [], "heal": {"config": "/runs/x/pruned/heal.yaml",
                                                 "command": "finetune-studio train /runs/x/pruned/heal.yaml"},
}


def _page(make_studio):
    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    studio.window.show_page("export")
    page = studio.pages["export"]
    assert page.prune.prune_button.isEnabled() and page.prune.rank_button.isEnabled()
    return page, folder


def test_bad_picks_are_one_red_line_and_start_nothing(qtbot, make_studio):
    page, _ = _page(make_studio)
    prune = page.prune
    started = []
    prune.jobs.start = lambda *a, **k: started.append((a, k))
    prune.layers_edit.setText("9")
    prune.prune_button.click()
    assert "out of range; this model has 4 layers" in prune.status_label.text()
    assert "dc2626" in prune.status_label.styleSheet()
    prune.layers_edit.setText("")
    prune.count_spin.setValue(4)
    prune.prune_button.click()
    assert "would leave none" in prune.status_label.text()
    prune.count_spin.setValue(0)
    prune.prune_button.click()
    assert prune.status_label.text().startswith("Nothing to prune: give layers") and "--" not in prune.status_label.text()
    prune.heads_spin.setValue(2)
    prune.prune_button.click()
    assert "drop at most 1 per layer" in prune.status_label.text()
    assert started == []


def test_picks_become_the_prune_jobs_params_and_its_report_is_shown(qtbot, make_studio):
    page, folder = _page(make_studio)
    prune = page.prune
    started = []
    prune.jobs.start = lambda folder_, config, job, params: started.append((folder_.path, job, params))
    prune.layers_edit.setText("1, 2")
    prune.heads_spin.setValue(1)
    prune.ffn_spin.setValue(0.75)
    prune.prune_button.click()
    assert started == [(folder.path, "prune", {"rank_only": False, "overwrite": False, "drop_layers": [1, 2],
                                                "drop_heads": 1, "ffn_keep": 0.75})]
    out = folder.path / "pruned"
    out.mkdir()
    (out / "prune_report.json").write_text(json.dumps(REPORT))
    prune._on_jobs_ended(JobOutcome(job="prune", status="finished", message=""))
    assert "layers:      4 -> 3" in prune.text.toPlainText()
    assert "heal it:     finetune-studio train" in prune.text.toPlainText()
    assert prune.status_label.text().startswith("Pruned: /runs/x/pruned")
    prune.rank_button.click()
    assert started[-1] == (folder.path, "prune", {"rank_only": True, "overwrite": False})
    prune.prune_button.click()  # the folder now holds the last pruned model
    assert "already holds files; tick Overwrite" in prune.status_label.text() and len(started) == 2
    prune.overwrite_check.setChecked(True)
    prune.prune_button.click()
    assert len(started) == 3 and started[-1][2]["overwrite"] is True


def test_a_runs_last_report_shows_when_it_is_picked(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    (folder.path / "pruned").mkdir()
    (folder.path / "pruned" / "prune_report.json").write_text(json.dumps(REPORT))
    studio.window.show_page("export")
    assert "parameters:  4,196,608 -> 3,409,664" in studio.pages["export"].prune.text.toPlainText()
    assert isinstance(folder, RunFolder)


def test_refusals_name_the_tabs_fields_not_the_clis_flags():
    from studio.widgets.prune_widget import in_words

    said = in_words("--drop-layers 9: out of range; this model has 2 layers (at most --layers 1)")
    assert "--" not in said and said.startswith("Drop layers 9: out of range")
    assert in_words("--drop-heads 3: too many; drop at most 1 per layer").startswith("Drop head groups per layer 3")
