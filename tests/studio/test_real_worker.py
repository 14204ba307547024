"""The window driving the real worker on the bundled tiny model: the whole spine, for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.core.runs.run_folder import RunFolder

ROOT = Path(__file__).resolve().parents[2]
MISSING = [p for p in ("resources/tiny/config.json", "backend/worker/__main__.py") if not (ROOT / p).exists()]


@pytest.mark.skipif(bool(MISSING), reason=f"the real worker or bundled model is not built yet (missing: "
                                          f"{', '.join(MISSING)})")
def test_real_worker_stops_resumes_and_finishes_from_the_window(qtbot, make_studio):
    studio = make_studio(None)  # None: the real `python -m backend.worker`
    jobs, page = studio.jobs["train"], studio.train_page
    outcomes = []
    jobs.ended.connect(outcomes.append)
    studio.config.set("name", "real-resume")
    studio.config.set("train.max_steps", 12)
    qtbot.waitUntil(lambda: studio.estimate.longest_answer is not None, timeout=10_000)
    page.start_button.click()
    qtbot.waitUntil(lambda: studio.store.count("loss") >= 2, timeout=300_000)
    page.stop_button.click()
    qtbot.waitUntil(lambda: not jobs.is_running(), timeout=300_000)
    assert [o.status for o in outcomes] == ["stopped"], outcomes
    log = studio.window.log_text()
    assert log.index("stopping at step") < log.index("Stopped at step")  # the worker's line first, as it happened
    folder = RunFolder(studio.controller.folder.path)
    checkpoint = folder.latest_checkpoint()
    assert folder.status() == "stopped" and checkpoint is not None
    step = int(checkpoint.name.rsplit("-", 1)[1])
    assert studio.window.resume_action.text() == f"Resume real-resume (step {step})"
    studio.estimate.recompute()  # calibrated now with the stopped attempt's measured baseline too
    predicted = studio.estimate.total_bytes
    page.resume_button.click()
    qtbot.waitUntil(lambda: not jobs.is_running(), timeout=300_000)
    assert [o.status for o in outcomes] == ["stopped", "finished"], outcomes[-1]
    assert outcomes[-1].event.steps == 12 and studio.controller.folder.path == folder.path
    steps, _ = studio.store.series("loss")
    assert steps[0] == 1 and steps[-1] == 12  # the stopped part's curve came back, then the rest
    assert page.status_label.text().startswith("Finished")
    assert folder.status() == "finished"
    assert studio.window.resume_action.text() == "Train real-resume more…"
    # memory.json: the worker's measured peak beside the estimate the window showed before Start
    from backend.core.runs.memory_record import MemoryRecord

    record = MemoryRecord.read(folder.path)
    assert record is not None and record.predicted_total_bytes == predicted
    assert f"last run: {record.comparison()}" in page.gpu_panel.peak_label.text()
