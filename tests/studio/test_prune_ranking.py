"""The Prune tab's ranking is a table: ticking layers, head groups or the FFN's weakest quarter fills the
prune fields the job takes (issue 33); before any ranking a wrapping hint says what to do."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

from studio.job_controller import JobOutcome
from studio.widgets.prune_ranking_widget import PruneRankingWidget
from tests.fakes import fake_command
from tests.studio.test_export_page import finished_run

RANKING = {
    "calibration": {"rows": 8, "tokens": 512},
    "layers": {"how": "cosine distance of each layer's input and output", "least_important_first": [2, 1, 3, 0],
               "scores": [{"layer": i, "score": s} for i, s in enumerate((0.9, 0.2, 0.1, 0.5))]},
    "heads": {"how": "attention output norm per key/value group", "unit": "key/value group",
              "scores": [[0.3, 0.1], [0.2, 0.4], [0.5, 0.6], [0.7, 0.2]],
              "least_important_first": [[1, 0], [0, 1], [0, 1], [1, 0]]},
    "ffn": {"how": "activation x weight per channel", "intermediate_size": 768,
            "per_layer": [{"min": 0.01, "median": 0.5, "max": 2.0, "weakest_quarter_share": 0.04}] * 4},
}


def _row(table: PruneRankingWidget, text: str):
    found = table.findItems(text, Qt.MatchFlag.MatchExactly | Qt.MatchFlag.MatchRecursive, 0)
    assert len(found) == 1, text
    return found[0]


def test_ticking_the_ranking_fills_the_prune_fields_and_the_job_gets_them(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    folder = finished_run(studio)
    studio.window.show_page("export")
    prune = studio.pages["export"].prune
    assert prune.hint.isVisibleTo(prune) and prune.hint.wordWrap() and not prune.ranking.isVisibleTo(prune)
    started = []
    prune.jobs.start = lambda folder_, config, job, params: started.append(params)
    prune.rank_button.click()
    (folder.path / "prune_ranking.json").write_text(json.dumps(RANKING))
    prune._on_jobs_ended(JobOutcome(job="prune", status="finished", message=""))
    table = prune.ranking
    assert table.isVisibleTo(prune) and not prune.hint.isVisibleTo(prune) and not prune.text.isVisibleTo(prune)
    layers = table.topLevelItem(0)
    assert [layers.child(r).text(0) for r in range(layers.childCount())] == ["layer 2", "layer 1", "layer 3", "layer 0"]
    assert layers.child(0).text(1) == "0.1000"
    _row(table, "layer 2").setCheckState(0, Qt.CheckState.Checked)
    _row(table, "layer 1").setCheckState(0, Qt.CheckState.Checked)
    for layer, group in ((0, 1), (1, 0), (2, 0), (3, 1)):
        _row(table, f"layer {layer} · group {group}").setCheckState(0, Qt.CheckState.Checked)
    _row(table, "cut each layer's weakest quarter").setCheckState(0, Qt.CheckState.Checked)
    assert prune.layers_edit.text() == "1,2" and prune.heads_edit.text() == "0:1,1:0,2:0,3:1"
    assert prune.ffn_spin.value() == 0.75
    prune.prune_button.click()
    assert prune.status_label.text() == "Pruning…", prune.status_label.text()
    assert started[-1] == {"rank_only": False, "overwrite": False, "drop_layers": [1, 2],
                           "drop_heads": ["0:1", "1:0", "2:0", "3:1"], "ffn_keep": 0.75}


def test_an_uneven_head_pick_is_refused_in_the_tabs_words(qtbot, make_studio):
    studio = make_studio(fake_command("normal"))
    finished_run(studio)
    studio.window.show_page("export")
    prune = studio.pages["export"].prune
    prune.jobs.start = lambda *a, **k: None
    prune.ranking.set_ranking(RANKING)
    prune._show_view(prune.ranking)
    _row(prune.ranking, "layer 0 · group 1").setCheckState(0, Qt.CheckState.Checked)
    prune.prune_button.click()
    said = prune.status_label.text()
    assert "each layer must lose the same number" in said and "--" not in said and "dc2626" in prune.status_label.styleSheet()
