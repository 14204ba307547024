"""The Techniques page's card picker and Make it fit (issue 33 item 3): the memory the run is for
changes what "fits" means, and the proposal applies to the draft in one click."""

from __future__ import annotations

from backend.core.paths import resources_dir
from backend.estimate.cards import usable_bytes
from tests.conftest import ROOT
from tests.fakes.fake_nvml import FakeSampler

CONFIG_JSON = ROOT / "tests" / "fixtures" / "model_configs" / "meta-llama--Llama-3.1-8B-Instruct" / "config.json"


def _eight_b(qtbot, make_studio, tmp_path):
    (tmp_path / "config.json").write_text(CONFIG_JSON.read_text())
    studio = make_studio(sampler=FakeSampler(nvml=False))
    studio.pages["model"].use_preset(resources_dir() / "presets" / "llama-3.1-8b_qlora_16gb.yaml")
    for key, value in (("model.path", str(tmp_path)), ("technique.method", "lora"),
                       ("technique.gradient_checkpointing", False), ("train.micro_batch_size", 4),
                       ("train.gradient_accumulation_steps", 4)):
        studio.config.set(key, value)
    return studio, studio.estimate, studio.pages["techniques"]


def _pick(qtbot, estimate, page, card):
    page.target.choose(card)
    qtbot.waitUntil(lambda: estimate.breakdown is not None and estimate.seq_len_answer is not None
                    and estimate.seq_len_answer.limit_bytes == estimate.limit_bytes, timeout=10000)


def test_the_card_picker_changes_what_fits_means(qtbot, make_studio, tmp_path):
    studio, estimate, page = _eight_b(qtbot, make_studio, tmp_path)
    machine = estimate.machine
    _pick(qtbot, estimate, page, 141)
    assert estimate.device == "cuda" and estimate.limit_bytes == usable_bytes(141) and estimate.verdict() == "fits"
    assert "141 GB card" in page.breakdown.limit_label.text() and not page.target.fit_button.isVisibleTo(page)
    assert estimate.peak_bytes is None  # a card's CUDA estimate predicts nothing for a run on this CPU machine
    _pick(qtbot, estimate, page, 12)
    assert estimate.limit_bytes == usable_bytes(12) and estimate.verdict() == "too_big"
    assert page.max_seq_len_label.text().startswith("Longest that fits 12 GB: ")
    assert "a 12 GB card" in page.max_seq_len_label.toolTip()
    assert page.target.fit_button.isVisibleTo(page)
    _pick(qtbot, estimate, page, 20)  # a custom size
    assert page.target.custom.isVisibleTo(page) and estimate.limit_bytes == usable_bytes(20)
    page.target.choose(None)  # this machine again: the detected device and its memory
    assert (estimate.device, estimate.limit_bytes, estimate.limit_label) == machine
    qtbot.waitUntil(lambda: estimate.breakdown is not None and estimate.peak_bytes == estimate.total_bytes, timeout=10000)


def test_make_it_fit_applies_the_plan_and_the_estimate_follows(qtbot, make_studio, tmp_path):
    studio, estimate, page = _eight_b(qtbot, make_studio, tmp_path)
    _pick(qtbot, estimate, page, 12)
    page.target.fit_button.click()
    dialog = page.target.dialog
    plan = dialog.plan
    assert plan.fits and not plan.already_fits and dialog.steps.rowCount() == len(plan.steps)
    assert dialog.steps.item(0, 0).text() == "Smaller micro-batches, more accumulation steps"
    assert "not measured on a GPU yet" in dialog.steps.item(0, 1).text()
    assert dialog.parts.item(dialog.parts.rowCount() - 1, 2).text() != dialog.parts.item(dialog.parts.rowCount() - 1, 1).text()
    assert estimate.total_bytes == plan.total_before
    dialog.apply_button.click()
    for key, value in plan.changes().items():
        assert studio.config.get(key) == value
    assert studio.config.get("train.micro_batch_size") * studio.config.get("train.gradient_accumulation_steps") == 16
    qtbot.waitUntil(lambda: estimate.total_bytes == plan.total_after, timeout=10000)
    assert estimate.verdict() in ("fits", "tight") and not page.target.fit_button.isVisibleTo(page)


def test_start_is_still_judged_for_this_machine_while_a_card_is_picked(qtbot, make_studio, tmp_path):
    studio, estimate, page = _eight_b(qtbot, make_studio, tmp_path)
    _pick(qtbot, estimate, page, 24)
    studio.config.set("technique.precision", "fp16")  # runs on a card, not on this CPU machine
    qtbot.waitUntil(lambda: "technique.precision" in estimate.start_blocker(), timeout=10000)
    assert not any(v.field == "technique.precision" and v.blocks for v in estimate.verdicts)
