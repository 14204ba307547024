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


def test_packing_shows_unticked_with_why_while_a_trl_objective_ignores_it(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))
    page, config = studio.pages["techniques"], studio.config
    config.set("technique.packing", True)
    box = page.editor("technique.packing")
    assert box.isChecked() and box.isEnabled()
    config.set("technique.objective", "dpo")
    assert not box.isChecked() and not box.isEnabled()
    assert "Not used by DPO" in box.toolTip() and "Not used by DPO" in page.labels["technique.packing"].toolTip()
    assert config.get("technique.packing") is True  # the draft keeps the SFT value
    config.set("technique.objective", "sft")
    assert box.isChecked() and box.isEnabled()


def test_offload_activations_is_marked_where_it_cannot_act(qtbot, make_studio):
    studio = make_studio(sampler=FakeSampler(nvml=False))  # a CPU machine
    page, config, estimate = studio.pages["techniques"], studio.config, studio.estimate
    box, label = page.editor("technique.activation_offload"), page.labels["technique.activation_offload"]
    config.set("technique.activation_offload", False)
    assert not box.isEnabled() and "needs a CUDA GPU" in box.toolTip() and "needs a CUDA GPU" in label.toolTip()
    estimate.set_card(24)  # the estimate for a 24 GB card: CUDA
    qtbot.waitUntil(lambda: estimate.device == "cuda", timeout=10000)
    config.set("technique.gradient_checkpointing", True)
    config.set("technique.torch_compile", False)
    assert box.isEnabled() and "Does nothing" not in label.toolTip()
    config.set("technique.gradient_checkpointing", False)
    assert not box.isEnabled() and "needs gradient checkpointing" in label.toolTip()
    config.set("technique.activation_offload", True)  # ticked where it does nothing: enabled, to untick it
    assert box.isEnabled() and "needs gradient checkpointing" in label.toolTip() and label.styleSheet()
