"""The window's Start follows the one verdict `train` refuses with (feasibility.before_start): every
problem at once, a model that is not downloaded and a strategy this machine cannot launch included;
while one problem is shown, no other impossible choice stays clickable unsaid."""

from __future__ import annotations

from tests.fakes import fake_command
from tests.fakes.fake_nvml import FakeSampler

NO_GPU = FakeSampler(nvml=False)


def blocked(studio) -> bool:
    return not studio.window.start_action.isEnabled() and not studio.train_page.start_button.isEnabled()


def test_a_rule_across_sections_and_an_impossible_choice_are_shown_together(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    estimate, page = studio.estimate, studio.pages["techniques"]
    qtbot.waitUntil(lambda: estimate.breakdown is not None, timeout=5000)
    studio.config.set("data.path", "bundled:datasets/demo_kto.jsonl")
    studio.config.set("technique.objective", "kto")
    studio.config.set("train.micro_batch_size", 1)
    qtbot.waitUntil(lambda: "technique.objective kto needs" in estimate.start_blocker(), timeout=5000)
    liger = page.editor("technique.liger_kernel")
    assert not liger.isChecked() and not liger.isEnabled()  # impossible here: not clickable while KTO's shows
    studio.config.set("technique.liger_kernel", True)  # e.g. a config saved on a GPU machine
    qtbot.waitUntil(lambda: "technique.liger_kernel" in estimate.start_blocker(), timeout=5000)
    lines = estimate.start_blocker().splitlines()
    assert len(lines) == 2 and lines[0].startswith("technique.objective kto needs") and \
        lines[1].startswith("technique.liger_kernel: ")
    assert blocked(studio) and all(line in studio.train_page.blocker_label.text() for line in lines)
    assert "#dc2626" in page.labels["technique.liger_kernel"].styleSheet()
    studio.window.start_action.trigger()
    assert not studio.client.is_running()


def test_start_waits_for_a_model_that_is_not_downloaded(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)
    studio.config.set("model.path", "hub:nobody/nothing")
    qtbot.waitUntil(lambda: blocked(studio), timeout=5000)
    assert studio.estimate.start_blocker().startswith("model.path: hub:nobody/nothing is not downloaded yet")
    studio.train_page.start_button.click()
    assert not studio.client.is_running()


def test_deepspeed_on_this_cpu_disables_start_with_the_field(qtbot, make_studio):
    studio = make_studio(fake_command("normal"), sampler=NO_GPU)
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)
    studio.config.set("hardware.strategy", "deepspeed_zero2")
    qtbot.waitUntil(lambda: blocked(studio), timeout=5000)
    assert studio.estimate.start_blocker() == ("hardware.strategy: deepspeed_zero2 runs through DeepSpeed, "
                                               "which needs a CUDA GPU")
