"""One estimate everywhere: the Techniques page, the Train page and `finetune-studio estimate` show the
same total with the same parts; predicted against measured on the Train and Runs pages; and Start
refused, with the reason, for what this machine cannot run."""

from __future__ import annotations

import json

from backend.estimate.calibration import Calibration
from backend.core.config.run_config import RunConfig
from backend.estimate import MIB, human_bytes
from backend.core.runs.memory_record import MemoryRecord
from backend.core.runs.run_folder import RunFolder
from tests.conftest import PRESET
from tests.fakes.fake_nvml import FakeSampler

NO_GPU = FakeSampler(nvml=False)


def measured_run(name: str, baseline: int, predicted: int = 600 * MIB, measured: int = 590 * MIB) -> RunFolder:
    folder = RunFolder.create(RunConfig.from_dict({"name": name}))
    folder.append_event({"type": "JobFinished", "run_dir": str(folder.path), "steps": 1, "final_loss": 1.0})
    MemoryRecord(device="cpu", outcome="finished", predicted_total_bytes=predicted, measured_peak_bytes=measured,
                 measured_kind="worker peak RSS (VmHWM)", process_baseline_bytes=baseline,
                 calibration="process baseline 500.0 MiB: calibrated from 1 run measured here").write(folder.path)
    return folder


def table(page) -> dict[str, str]:
    rows = page.breakdown.table
    return {rows.item(r, 0).text(): rows.item(r, 1).text() for r in range(rows.rowCount())}


def test_the_preset_shows_one_total_on_the_techniques_page_the_train_page_and_the_cli(qtbot, make_studio, capsys):
    for index, baseline in enumerate((498, 506, 530)):  # runs measured here: the CPU runtime is calibrated
        measured_run(f"before{index}", baseline * MIB)
    studio = make_studio(sampler=NO_GPU)
    estimate, techniques = studio.estimate, studio.pages["techniques"]
    qtbot.waitUntil(lambda: estimate.longest_answer is not None and estimate.breakdown is not None
                    and estimate.breakdown.details["logits"]["target_tokens"] == estimate.longest_answer, timeout=5000)

    from backend.cli.app import main

    assert main(["estimate", str(PRESET), "--json", "--device", "cpu"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert estimate.total_bytes == cli["total_bytes"] and estimate.breakdown.breakdown() == cli["breakdown"]
    assert estimate.breakdown.runtime == 506 * MIB == Calibration.read().baseline_bytes
    assert "calibrated from 3 runs measured here" in cli["calibration"]

    total = human_bytes(cli["total_bytes"])
    shown = table(techniques)
    assert shown["Total"] == total and shown["Runtime (process baseline)"] == human_bytes(506 * MIB)
    assert f"predicted total {total}" in techniques.breakdown.verdict_label.text()
    assert "calibrated from 3 runs measured here" in techniques.breakdown.notes_label.text()
    qtbot.waitUntil(lambda: f"Predicted peak {total}" in studio.train_page.gpu_panel.peak_label.text(), timeout=5000)

    studio.config.set("train.micro_batch_size", 4)  # between runs the Train page follows the draft
    qtbot.waitUntil(lambda: estimate.total_bytes != cli["total_bytes"], timeout=5000)
    qtbot.waitUntil(lambda: f"Predicted peak {human_bytes(estimate.total_bytes)}"
                    in studio.train_page.gpu_panel.peak_label.text(), timeout=5000)


def test_predicted_against_measured_on_the_runs_and_train_pages(qtbot, make_studio):
    folder = measured_run("measured", 500 * MIB, predicted=620 * MIB, measured=598 * MIB)
    unmeasured = RunFolder.create(RunConfig.from_dict({"name": "old"}))
    studio = make_studio(sampler=NO_GPU)
    page = studio.pages["runs"]
    studio.window.show_page("runs")
    column = [page.table.horizontalHeaderItem(c).text() for c in range(page.table.columnCount())].index("Memory")
    cells = {page.table.item(r, 0).text(): page.table.item(r, column) for r in range(page.table.rowCount())}
    assert cells["measured"].text() == "predicted 620.0 MiB, measured 598.0 MiB (96%)"
    assert "worker peak RSS (VmHWM)" in cells["measured"].toolTip()
    assert cells["measured"].toolTip().startswith(cells["measured"].text())  # a cut cell reads whole on hover
    assert cells["old"].text() == "—" and unmeasured.path.is_dir()

    studio.controller.folder = folder  # the last run
    studio.controller.show_peaks()
    text = studio.train_page.gpu_panel.peak_label.text()
    assert "last run: predicted 620.0 MiB, measured 598.0 MiB (96%), worker peak RSS (VmHWM)" in text
    assert text.startswith(f"Predicted peak {human_bytes(studio.estimate.total_bytes)}")


def test_what_this_cpu_cannot_run_disables_start_with_the_reason(qtbot, make_studio):
    studio = make_studio(sampler=NO_GPU)
    window, estimate, page = studio.window, studio.estimate, studio.pages["techniques"]
    qtbot.waitUntil(lambda: estimate.breakdown is not None, timeout=5000)
    assert window.start_action.isEnabled() and estimate.start_blocker() == ""
    plain_logits = estimate.breakdown.logits

    liger = page.editor("technique.liger_kernel")
    assert not liger.isEnabled()  # unticked and impossible here: disabled, the label says why
    assert "need a CUDA GPU" in page.labels["technique.liger_kernel"].toolTip()
    assert "liger_kernel" in page.marks.unavailable and "precision fp16" in page.marks.unavailable
    precision = page.editor("technique.precision")
    fp16 = [precision.itemText(i) for i in range(precision.count())].index("fp16")
    assert not precision.model().item(fp16).isEnabled()

    studio.config.set("technique.liger_kernel", True)  # e.g. a config saved on a GPU machine
    qtbot.waitUntil(lambda: not window.start_action.isEnabled(), timeout=5000)
    reason = "technique.liger_kernel: Liger's fused kernels are Triton kernels and need a CUDA GPU"
    assert estimate.start_blocker() == reason
    assert window.start_action.toolTip() == f"Cannot start: {reason}"
    assert not studio.train_page.start_button.isEnabled()
    assert studio.train_page.blocker_label.text() == f"Cannot start: {reason}"
    assert reason in page.feasibility_label.text() and liger.isEnabled()  # ticked: it can be unticked
    assert "#dc2626" in page.labels["technique.liger_kernel"].styleSheet()
    assert estimate.breakdown.logits == plain_logits  # Liger's saving is not counted where it cannot run
    window.start_action.trigger()
    assert not studio.client.is_running()

    studio.config.set("technique.liger_kernel", False)
    studio.config.set("technique.torch_compile", True)
    qtbot.waitUntil(lambda: estimate.start_blocker().startswith("technique.torch_compile:"), timeout=5000)
    studio.config.set("technique.torch_compile", False)
    studio.config.set("technique.optimizer", "paged_adamw_8bit")  # a faithful fallback: said, not refused
    qtbot.waitUntil(lambda: window.start_action.isEnabled(), timeout=5000)
    assert "Runs as adamw_8bit: paged_adamw_8bit -&gt; adamw_8bit" in page.feasibility_label.text()
    studio.config.set("technique.optimizer", "adamw")
    studio.config.set("train.seq_len", 4096)
    qtbot.waitUntil(lambda: estimate.start_blocker().startswith("train.seq_len: 4096 is longer than the model's "
                                                                 "context of 1,024 tokens"), timeout=5000)
    studio.config.set("train.seq_len", 256)
    qtbot.waitUntil(lambda: window.start_action.isEnabled() and not studio.train_page.blocker_label.isVisibleTo(
        studio.train_page), timeout=5000)


def test_a_dataset_the_data_page_cannot_read_blocks_start(qtbot, make_studio, tmp_path):
    studio = make_studio(sampler=NO_GPU)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"instruction": "Say hi", "output": ""}\n', encoding="utf-8")
    studio.config.set("data.path", str(broken))
    problem = studio.pages["data"].profile.problem
    assert problem
    qtbot.waitUntil(lambda: not studio.window.start_action.isEnabled(), timeout=5000)
    assert studio.estimate.start_blocker().startswith(f"data.path: {problem}")
    studio.config.set("data.path", "bundled:datasets/demo_train.jsonl")
    qtbot.waitUntil(lambda: studio.window.start_action.isEnabled(), timeout=5000)


def test_the_run_records_what_was_predicted_here(qtbot, make_studio):
    """memory.json's prediction is the one the window showed before Start (the worker computes it the same way)."""
    from backend.estimate.run_estimate import estimate_here

    studio = make_studio(sampler=NO_GPU)
    qtbot.waitUntil(lambda: studio.estimate.longest_answer is not None, timeout=5000)
    studio.estimate.recompute()
    config = studio.config.config()
    assert estimate_here(config, "cpu").total_bytes == studio.estimate.total_bytes
