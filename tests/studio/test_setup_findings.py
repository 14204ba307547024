"""The setup pages' smaller findings of a walk through the window (issue 33, item 6): each one kept fixed."""

from __future__ import annotations

from tests.fakes.fake_nvml import FakeSampler


def test_the_cards_line_hides_while_there_is_no_estimate(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    estimate, breakdown = studio.estimate, studio.pages["techniques"].breakdown
    qtbot.waitUntil(lambda: bool(estimate.cards) and estimate.breakdown is not None, timeout=10000)
    assert breakdown.cards_label.text().startswith("On CUDA: ") and not breakdown.cards_label.isHidden()
    studio.config.set("train.micro_batch_size", 0)  # invalid: no estimate
    qtbot.waitUntil(lambda: estimate.breakdown is None, timeout=10000)
    assert "No estimate" in breakdown.verdict_label.text()
    assert breakdown.cards_label.isHidden() and breakdown.cards_label.text() == ""
