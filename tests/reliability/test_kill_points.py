"""SIGKILL the real worker at five points of a run while the studio's WorkerClient watches."""

import pytest

from tests.reliability.kill_trial import POINTS, run_trial


@pytest.mark.parametrize("point", list(POINTS))
def test_worker_killed_at_point_is_survived(bundled_model, qapp, point):
    result = run_trial(point, POINTS[point])
    assert result.crash_reported, result
    assert "the worker stopped" in result.crash_message
    assert result.status_after_kill == "failed", result
    assert result.checkpoints_loaded == len(result.checkpoints), result
    assert result.survived, result
