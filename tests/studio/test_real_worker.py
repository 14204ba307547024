"""The window driving the real worker on the bundled tiny model: the whole spine, for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.runs import RunFolder

ROOT = Path(__file__).resolve().parents[2]
MISSING = [p for p in ("resources/tiny/config.json", "backend/worker/__main__.py") if not (ROOT / p).exists()]


@pytest.mark.skipif(bool(MISSING), reason=f"the real worker or bundled model is not built yet (missing: "
                                          f"{', '.join(MISSING)})")
def test_real_worker_trains_a_few_steps_from_the_window(qtbot, make_studio):
    studio = make_studio(None)  # None: the real `python -m backend.worker`
    finished, failed, crashed = [], [], []
    studio.client.job_finished.connect(finished.append)
    studio.client.job_failed.connect(failed.append)
    studio.client.worker_crashed.connect(crashed.append)
    studio.config.set("train.max_steps", 5)
    qtbot.waitUntil(lambda: studio.estimate.longest_answer is not None, timeout=10_000)
    studio.estimate.recompute()
    predicted = studio.estimate.total_bytes
    studio.train_page.start_button.click()
    qtbot.waitUntil(lambda: not studio.client.is_running(), timeout=300_000)
    assert not crashed, crashed
    assert not failed, failed
    assert finished and finished[0].steps == 5 and not finished[0].stopped
    assert studio.store.count("loss") >= 1
    assert studio.train_page.status_label.text().startswith("Finished")
    assert RunFolder(studio.controller.folder.path).status() == "finished"
    # memory.json: the worker's measured peak beside the estimate the window showed before Start
    from backend.memory_record import MemoryRecord

    record = MemoryRecord.read(studio.controller.folder.path)
    assert record is not None and record.predicted_total_bytes == predicted
    assert f"last run: {record.comparison()}" in studio.train_page.gpu_panel.peak_label.text()
