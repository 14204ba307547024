"""Tracebacks stay in worker.log; the log pane gets one pointer line per traceback."""

from __future__ import annotations

from studio.services.log_filter import POINTER, TracebackFilter

LOG = """\
2026-01-01 INFO backend.worker: loading
2026-01-01 ERROR backend.worker: job failed: boom
Traceback (most recent call last):
  File "x.py", line 1, in <module>
    raise KeyError("a")
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "x.py", line 3, in <module>
    raise ValueError("boom")
ValueError: boom
2026-01-01 INFO backend.worker: after"""


def test_traceback_becomes_one_pointer_line():
    keep = TracebackFilter()
    shown = [line for line in (keep.feed(raw) for raw in LOG.splitlines()) if line is not None]
    assert shown == [
        "2026-01-01 INFO backend.worker: loading",
        "2026-01-01 ERROR backend.worker: job failed: boom",
        POINTER,
        "2026-01-01 INFO backend.worker: after",
    ]


# Lines as the worker writes them (logging.captureWarnings, its log format), and as Python prints
# a warning before logging is set up; the bitsandbytes line is the one its CPU backend logs.
NOISY = """\
2026-12-02 06:11:40,100 rank0 INFO backend.worker: loading the model
2026-12-02 06:11:43,502 rank0 WARNING bitsandbytes.backends.cpu.ops: Failed to load CPU gemm_4bit_forward \
from kernels-community: No module named 'kernels'. Please make sure you already `pip install kernels` and \
the kernels >= 0.11.1
2026-12-02 06:11:48,731 rank0 WARNING py.warnings: /venv/lib/python3.11/site-packages/torch/jit/_script.py:365: \
DeprecationWarning: `torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.
  warnings.warn(

2026-12-02 06:11:48,788 rank0 WARNING py.warnings: /venv/x.py:9: FutureWarning: no source line here

/venv/lib/python3.11/site-packages/peft/tuners/lora.py:77: UserWarning: fan_in_fan_out is set to False
  warnings.warn(
/venv/y.py:3: PendingDeprecationWarning: soon gone
2026-12-02 06:11:49,000 rank0 WARNING backend.training: packing is off: the dataset has one example
  an indented line that is not a warning's source
2026-12-02 06:11:49,100 rank0 WARNING backend.worker: a RuntimeWarning: stays, not a Python warning line
2026-12-02 06:11:50,000 rank0 INFO backend.worker: training"""


def test_warnings_and_install_advice_are_hidden_the_rest_is_kept():
    keep = TracebackFilter()
    shown = [line for line in (keep.feed(raw) for raw in NOISY.splitlines()) if line is not None]
    assert shown == [
        "2026-12-02 06:11:40,100 rank0 INFO backend.worker: loading the model",
        "2026-12-02 06:11:49,000 rank0 WARNING backend.training: packing is off: the dataset has one example",
        "  an indented line that is not a warning's source",
        "2026-12-02 06:11:49,100 rank0 WARNING backend.worker: a RuntimeWarning: stays, not a Python warning line",
        "2026-12-02 06:11:50,000 rank0 INFO backend.worker: training",
    ]


def test_a_traceback_after_a_warning_still_leaves_its_pointer():
    keep = TracebackFilter()
    lines = ["/x.py:1: UserWarning: careful", "  warnings.warn(", "Traceback (most recent call last):",
             '  File "x.py", line 1, in <module>', "ValueError: boom", "after"]
    assert [shown for shown in map(keep.feed, lines) if shown is not None] == [POINTER, "after"]
