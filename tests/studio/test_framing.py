"""Line framing: pipe reads end anywhere, and every event must still arrive whole and in order."""

from __future__ import annotations

from backend.core.protocol import (
    PROTOCOL_VERSION,
    JobFinished,
    JobStarted,
    MetricsLogged,
    PhaseChanged,
    WorkerReady,
    encode,
)
from studio.services.line_buffer import LineBuffer
from studio.services.worker_client import WorkerClient, describe_exit


def _events() -> list:
    return [
        JobStarted(run_dir="/tmp/run", max_steps=3),
        PhaseChanged(phase="train", detail="ünïcødé ✓ — split me"),
        *[MetricsLogged(step=i, max_steps=3, loss=2.0 / i, tokens_per_s=100.0 * i) for i in (1, 2, 3)],
        JobFinished(run_dir="/tmp/run", steps=3, final_loss=0.66),
    ]


def _chunks(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        out.append(data[pos:pos + size])
        pos, i = pos + size, i + 1
    return out


def test_line_buffer_handles_partial_lines_and_split_characters():
    buffer = LineBuffer()
    text = "première ligne\nsecond ✓\nthird"
    data = text.encode("utf-8")
    lines = []
    for i in range(len(data)):  # one byte at a time: every multi-byte character gets cut
        lines += buffer.feed(data[i:i + 1])
    assert lines == ["première ligne", "second ✓"]
    assert buffer.flush() == "third" and buffer.flush() is None


def test_line_buffer_many_lines_in_one_chunk_and_crlf():
    assert LineBuffer().feed(b"a\r\nb\n\nc\n") == ["a", "b", "", "c"]


def test_client_decodes_events_from_odd_chunks(qtbot):
    client = WorkerClient()
    got, errors, finished = [], [], []
    client.event_received.connect(got.append)
    client.protocol_error.connect(errors.append)
    client.job_finished.connect(finished.append)
    expected = _events()
    data = "".join(encode(e) for e in expected).encode("utf-8")
    for chunk in _chunks(data, [1, 7, 300, 3, 64, 1000, 2]):
        client.feed_stdout(chunk)
    assert errors == []
    assert got == expected
    assert finished == [expected[-1]]


def test_client_survives_garbage_between_events(qtbot):
    client = WorkerClient()
    got, errors = [], []
    client.event_received.connect(got.append)
    client.protocol_error.connect(errors.append)
    good = encode(MetricsLogged(step=1, max_steps=2, loss=1.0))
    client.feed_stdout(b"Some library printed this\n" + good.encode() + b'{"type": "MetricsLogged"}\n\n')
    assert [e.step for e in got] == [1]
    assert len(errors) == 2
    assert "Some library printed this" in errors[0]
    assert "MetricsLogged" in errors[1]


def test_protocol_version_mismatch_fails_the_job(qtbot):
    client = WorkerClient()
    failed, errors = [], []
    client.job_failed.connect(failed.append)
    client.protocol_error.connect(errors.append)
    client.feed_stdout(encode(WorkerReady(protocol_version=PROTOCOL_VERSION + 1)).encode())
    assert failed and failed[0].kind == "bad_input"
    assert f"v{PROTOCOL_VERSION + 1}" in failed[0].message


def test_wrong_message_version_at_ready_fails_the_job(qtbot):
    client = WorkerClient()
    failed = []
    client.job_failed.connect(failed.append)
    client.feed_stdout(b'{"type": "WorkerReady", "v": 99}\n')
    assert failed and "v99" in failed[0].message


def test_describe_exit_names_code_and_signal():
    assert describe_exit(3, crashed=False)[0] == "the worker stopped unexpectedly (exit code 3)"
    text, hint = describe_exit(9, crashed=True)
    assert "killed by signal 9, SIGKILL" in text and "out of memory" in hint
    assert "signal 11, SIGSEGV" in describe_exit(11, crashed=True)[0]
